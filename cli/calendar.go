package cli

import (
	"encoding/json"
	"flag"
)

// calFlags are timer create's calendar flags.
type calFlags struct {
	cron, tz, repeated, skipped, catchUp, startAt, endAt *string
	window, jitterMax, maxFires                          *int64
	jitter                                               *float64
}

func calendarFlags(fs *flag.FlagSet) *calFlags {
	return &calFlags{
		cron:      fs.String("cron", "", "calendar timer: a cron expression, 5 fields or 6 (seconds first), or @hourly, @daily, @weekly, @monthly, @yearly (create)"),
		tz:        fs.String("tz", "", "the IANA zone the cron expression is read in (create; default UTC)"),
		repeated:  fs.String("dst-repeated", "", "a time that happens twice when clocks go back fires first, last or both (create; default first)"),
		skipped:   fs.String("dst-skipped", "", "a time the clocks skip fires when they jump (shift) or not (skip) (create; default shift)"),
		catchUp:   fs.String("catchup", "", "times missed while chime was down: skip, one or all (create; default one)"),
		startAt:   fs.String("start-at", "", "RFC 3339 time before which it does not fire (create)"),
		endAt:     fs.String("end-at", "", "RFC 3339 time after which it does not fire (create)"),
		window:    fs.Int64("catchup-window-ms", 0, "how far back one or all catch up (create)"),
		jitterMax: fs.Int64("jitter-max-ms", 0, "the most jitter delays a fire (create; default 60000)"),
		maxFires:  fs.Int64("max-fires", 0, "complete after N fires (create)"),
		jitter:    fs.Float64("jitter", 0, "delay each fire by up to this share of its period, the same each time (create)"),
	}
}

// body is the calendar create's body, with only the flags given; false
// without --cron.
func (f *calFlags) body(fs *flag.FlagSet, summary, requestID string) ([]byte, bool) {
	if *f.cron == "" {
		return nil, false
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	m := map[string]any{"cron": *f.cron}
	for flagName, v := range map[string]any{
		"tz": *f.tz, "dst-repeated": *f.repeated, "dst-skipped": *f.skipped, "catchup": *f.catchUp,
		"start-at": *f.startAt, "end-at": *f.endAt, "catchup-window-ms": *f.window, "jitter-max-ms": *f.jitterMax,
		"max-fires": *f.maxFires, "jitter": *f.jitter, "summary": summary, "request-id": requestID,
	} {
		if set[flagName] {
			m[jsonName(flagName)] = v
		}
	}
	b, _ := json.Marshal(m)
	return b, true
}

// jsonName is a flag's request field.
func jsonName(flagName string) string {
	out := []byte(flagName)
	for i, c := range out {
		if c == '-' {
			out[i] = '_'
		}
	}
	return string(out)
}
