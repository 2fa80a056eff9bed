package subjects

import "time"

// FormatISO writes t as Python's isoformat does: microseconds only when
// present, the offset as +HH:MM (UTC is +00:00).
func FormatISO(t time.Time) string {
	layout := "2006-01-02T15:04:05-07:00"
	if t.Nanosecond()/1000 != 0 {
		layout = "2006-01-02T15:04:05.000000-07:00"
	}
	return t.Truncate(time.Microsecond).Format(layout)
}
