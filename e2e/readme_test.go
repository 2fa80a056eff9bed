package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/testlog"
)

// TestREADME runs every command of README's worked examples (the section
// "Worked example with the `nats` CLI" and its subsections, up to the
// next level-2 heading), top to bottom, against a chime serve on a fresh
// data dir, as a reader would type them: `nats req` and `nats sub` through
// the Go client (the nats CLI is not needed), `chime ...` with the built
// binary, `curl ...` with net/http. Placeholders (tmr_..., wait_..., q_...,
// wf_..., mon_..., trg_..., chime_cb_..., 5b0c..., <next_cursor>) take the
// last such ID an earlier command printed. A reply that is an error fails
// the test, and so does a reply that does not have the fields a `# {...}`
// comment after the command shows. A line the test cannot read fails it
// too, with its line, unless its comment says `# not run: <why>`.
func TestREADME(t *testing.T) {
	steps, env, err := readmeSteps(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) < 50 {
		t.Fatalf("README: %d commands in the worked examples; the section was not found whole", len(steps))
	}

	dir := t.TempDir()
	// What the reader has at hand: a CI log for `chime monitor run ...
	// tail -f ci.log`.
	if err := os.WriteFile(filepath.Join(dir, "ci.log"), []byte("ok   ./a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	natsAddr, httpAddr := freeAddr(t), freeAddr(t)
	p := spawnPlain(t, "readme", httpAddr, append(env, "CHIME_DATA_DIR="+filepath.Join(dir, "data"), "CHIME_NATS_LISTEN="+natsAddr)...)
	p.waitReady(t)
	checkReadyLine(t, p, natsAddr, httpAddr)

	nc, err := nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// The KV buckets the examples open to monitors (CHIME_MONITOR_KV) are
	// the reader's: they exist.
	for _, kv := range env {
		list, ok := strings.CutPrefix(kv, "CHIME_MONITOR_KV=")
		if !ok {
			continue
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		for entry := range strings.SplitSeq(list, ",") {
			bucket, _, _ := strings.Cut(strings.TrimSpace(entry), "/")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket})
			cancel()
			if err != nil {
				t.Fatalf("the reader's KV bucket %s: %v", bucket, err)
			}
		}
	}
	r := &readmeRun{t: t, nc: nc, natsURL: "nats://" + natsAddr, httpAddr: httpAddr, dir: dir, ids: map[string]string{}}
	defer r.stopAll()
	// The test's own view of the inboxes, to know when an intervention
	// has been applied.
	r.inbox = &bgCmd{}
	sub, err := nc.Subscribe("agent.*.inbox", func(m *nats.Msg) { r.inbox.add(string(m.Data)) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	start := time.Now()
	for _, st := range steps {
		if st.notRun != "" {
			t.Logf("README.md:%d: not run (%s): %s", st.line, st.notRun, st.text)
			continue
		}
		r.step(st)
		if t.Failed() {
			return
		}
	}
	r.stopAll()
	t.Logf("%d README commands in %v", len(steps), time.Since(start).Round(time.Millisecond))
}

// checkReadyLine checks that chime serve says where it is: the NATS URL,
// the HTTP base and the console.
func checkReadyLine(t *testing.T, p *proc, natsAddr, httpAddr string) {
	t.Helper()
	var ready string
	eventually(t, 5*time.Second, "the `chime ready` log line", func() bool {
		for l := range strings.SplitSeq(p.logs.String(), "\n") {
			if strings.Contains(l, "chime ready") {
				ready = l
				return true
			}
		}
		return false
	})
	for _, want := range []string{"nats=nats://" + natsAddr, "http=http://" + httpAddr + " ", "console=http://" + httpAddr + "/"} {
		if !strings.Contains(ready+" ", want) {
			t.Errorf("chime ready line %q: no %q", ready, want)
		}
	}
}

// cleanEnv is this process's environment without CHIME_ settings: a
// reader's first chime has none.
func cleanEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "CHIME_") })
}

// spawnPlain starts `chime serve` with chime's defaults (no harness
// settings) and env.
func spawnPlain(t testing.TB, id, httpAddr string, env ...string) *proc {
	t.Helper()
	p := &proc{httpAddr: httpAddr, id: id, logs: &testlog.Buffer{}, exited: make(chan error, 1)}
	p.cmd = exec.Command(binary, "serve")
	p.cmd.Env = append(cleanEnv(), append(env, "CHIME_HTTP_ADDR="+httpAddr, "CHIME_REPLICA_ID="+id)...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("--- %s log ---\n%s", id, p.logs.String())
		}
	})
	return p
}

// step is one command of the worked examples.
type step struct {
	line    int      // its README line
	text    string   // the command as written
	args    []string // its words, placeholders unfilled
	bg      bool     // it ends with &
	notRun  string   // why it is not run (`# not run: why`)
	comment string   // its comments: on its line and on the comment lines after it
}

// readmeSteps reads the commands of the worked examples in path, and the
// settings the examples say chime runs with (`# with CHIME_X='v'`).
func readmeSteps(path string) ([]step, []string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	lines := strings.Split(string(raw), "\n")
	begin := slices.Index(lines, "## Worked example with the `nats` CLI")
	if begin < 0 {
		return nil, nil, errors.New("README.md: no section \"## Worked example with the `nats` CLI\"")
	}
	end := len(lines)
	for i := begin + 1; i < len(lines); i++ {
		if strings.HasPrefix(lines[i], "## ") {
			end = i
			break
		}
	}
	withRE := regexp.MustCompile(`^# with (CHIME_[A-Z_]+)='([^']*)'`)
	exampleHostRE := regexp.MustCompile(`://([a-z0-9-]+\.)*example\.com\b`)
	var steps []step
	var env []string
	lastOfLine := -1 // the step a following comment line belongs to
	for i := begin + 1; i < end; i++ {
		n := i + 1
		if strings.HasPrefix(lines[i], "```") {
			return nil, nil, fmt.Errorf("README.md:%d: a fenced block in the worked examples: indent it as the others are", n)
		}
		if !strings.HasPrefix(lines[i], "    ") {
			if strings.TrimSpace(lines[i]) == "" {
				lastOfLine = -1 // a new block
			}
			continue
		}
		text := strings.TrimSpace(lines[i])
		for strings.HasSuffix(text, "\\") && i+1 < end {
			i++
			text = strings.TrimSuffix(text, "\\") + " " + strings.TrimSpace(lines[i])
		}
		if strings.HasPrefix(text, "#") {
			if m := withRE.FindStringSubmatch(text); m != nil {
				env = append(env, m[1]+"="+m[2])
			}
			if lastOfLine >= 0 {
				c := &steps[lastOfLine].comment
				*c = strings.TrimSpace(*c + " " + strings.TrimSpace(strings.TrimPrefix(text, "#")))
			}
			continue
		}
		cmds, comment, err := parseLine(text)
		if err != nil {
			return nil, nil, fmt.Errorf("README.md:%d: %w: %s", n, err, text)
		}
		notRun := ""
		if why, ok := strings.CutPrefix(comment, "not run:"); ok {
			notRun = strings.TrimSpace(why)
			if notRun == "" {
				return nil, nil, fmt.Errorf("README.md:%d: `# not run:` says why", n)
			}
		} else if m := exampleHostRE.FindString(text); m != "" {
			// example.com (RFC 2606) stands for the reader's own system.
			notRun = "it needs the reader's own system (" + strings.TrimPrefix(m, "://") + ")"
		}
		for j, words := range cmds {
			st := step{line: n, text: strings.Join(words, " "), notRun: notRun}
			if last := len(words) - 1; words[last] == "&" {
				st.bg, words = true, words[:last]
			}
			st.args = words
			if j == len(cmds)-1 {
				st.comment = comment
			}
			if notRun == "" {
				if err := understood(st); err != nil {
					return nil, nil, fmt.Errorf("README.md:%d: %w: %s", n, err, text)
				}
			}
			steps = append(steps, st)
		}
		lastOfLine = len(steps) - 1
	}
	return steps, env, nil
}

// understood says why the test cannot run st, or nil.
func understood(st step) error {
	a := st.args
	switch a[0] {
	case "chime":
		if len(a) < 2 {
			return errors.New("chime without a command")
		}
		return nil
	case "nats":
		if len(a) >= 2 && a[1] == "micro" && len(a) == 3 && a[2] == "ls" {
			return nil
		}
		if len(a) >= 3 && a[1] == "sub" {
			return nil
		}
		if len(a) >= 4 && a[1] == "req" {
			_, err := natsReqArgs(a[2:])
			return err
		}
		return errors.New("a nats command the test does not run (it runs req, sub and micro ls)")
	case "curl":
		_, err := curlArgs(a[1:])
		return err
	}
	return fmt.Errorf("a command the test does not run (%q; mark it `# not run: <why>`)", a[0])
}

// word is one shell word of a README line.
type word struct {
	s      string
	quoted bool // written (partly) in quotes
	gap    int  // spaces before it
}

// parseLine splits a README code line into its commands, each a list of
// words with optional [...] groups resolved (kept when every word in
// them is concrete, dropped when they name a placeholder such as N or
// ID...), alternatives (start|stop) spelled out in order, and
// commands written side by side (two or more spaces before the next
// `chime`, `nats` or `curl`) or after `;` separated; and the comment at
// its end.
func parseLine(line string) ([][]string, string, error) {
	words, comment, err := shellWords(line)
	if err != nil {
		return nil, "", err
	}
	var groups [][]word
	var cur []word
	for _, w := range words {
		switch {
		case !w.quoted && w.s == ";":
			if len(cur) > 0 {
				groups = append(groups, cur)
			}
			cur = nil
			continue
		case !w.quoted && len(cur) > 0 && w.gap >= 2 && (w.s == "chime" || w.s == "nats" || w.s == "curl"):
			groups = append(groups, cur)
			cur = nil
		}
		cur = append(cur, w)
	}
	if len(cur) > 0 {
		groups = append(groups, cur)
	}
	var out [][]string
	for _, g := range groups {
		cmds, err := resolveCommand(g)
		if err != nil {
			return nil, "", err
		}
		out = append(out, cmds...)
	}
	return out, strings.TrimSpace(comment), nil
}

var (
	metaWord = regexp.MustCompile(`^[A-Z][A-Z_]*(\.\.\.)?$`) // N, ID, SEQ, ID...
	altWord  = regexp.MustCompile(`^[a-z][a-z-]*(\|[a-z][a-z-]*)+$`)
)

func resolveCommand(ws []word) ([][]string, error) {
	var words []string
	alt := -1
	for i := 0; i < len(ws); i++ {
		w := ws[i]
		if !w.quoted && strings.HasPrefix(w.s, "[") {
			j := i
			for j < len(ws) && (ws[j].quoted || !strings.HasSuffix(ws[j].s, "]")) {
				j++
			}
			if j == len(ws) {
				return nil, errors.New("an unclosed [")
			}
			var inner []string
			concrete := true
			for k := i; k <= j; k++ {
				s := ws[k].s
				if k == i {
					s = strings.TrimPrefix(s, "[")
				}
				if k == j {
					s = strings.TrimSuffix(s, "]")
				}
				if !ws[k].quoted && (metaWord.MatchString(s) || strings.Contains(s, "|") || strings.Contains(s, "...")) {
					concrete = false
				}
				if s != "" {
					inner = append(inner, s)
				}
			}
			if concrete {
				words = append(words, inner...)
			}
			i = j
			continue
		}
		if !w.quoted && strings.Contains(w.s, "|") {
			if !altWord.MatchString(w.s) || alt >= 0 {
				return nil, fmt.Errorf("an unquoted | the test does not read (%q)", w.s)
			}
			alt = len(words)
		}
		if !w.quoted && (w.s == "<" || w.s == ">" || strings.HasPrefix(w.s, ">") || w.s == "&&" || w.s == "||") {
			return nil, fmt.Errorf("a redirection or list (%q) the test does not run", w.s)
		}
		if !w.quoted && w.s == "&" && i != len(ws)-1 {
			return nil, errors.New("& before the end of a command")
		}
		words = append(words, w.s)
	}
	if len(words) == 0 {
		return nil, errors.New("an empty command")
	}
	if alt < 0 {
		return [][]string{words}, nil
	}
	var out [][]string
	for choice := range strings.SplitSeq(words[alt], "|") {
		c := slices.Clone(words)
		c[alt] = choice
		out = append(out, c)
	}
	return out, nil
}

// shellWords splits a line as sh does, for the quoting README uses:
// '...', "..." (with \" and \\), \ outside quotes, `;` and a trailing
// comment (# at the start of a word).
func shellWords(line string) ([]word, string, error) {
	var out []word
	var cur strings.Builder
	in, quoted, gap := false, false, 0
	flush := func() {
		if in {
			out = append(out, word{s: cur.String(), quoted: quoted, gap: gap})
		}
		cur.Reset()
		in, quoted, gap = false, false, 0
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == ' ' || c == '\t':
			if in {
				flush()
			}
			gap++
		case c == '#' && !in:
			return out, line[i+1:], nil
		case c == ';':
			flush()
			out = append(out, word{s: ";"})
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, "", errors.New("an unclosed '")
			}
			cur.WriteString(line[i+1 : i+1+j])
			in, quoted = true, true
			i += j + 1
		case c == '"':
			in, quoted = true, true
			i++
			for ; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' && i+1 < len(line) && strings.IndexByte(`"\$`+"`", line[i+1]) >= 0 {
					i++
				}
				cur.WriteByte(line[i])
			}
			if i == len(line) {
				return nil, "", errors.New(`an unclosed "`)
			}
		case c == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
			in = true
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	flush()
	return out, "", nil
}

// natsReq is a `nats req` command line.
type natsReq struct {
	subject, body string
	header        nats.Header
}

func natsReqArgs(a []string) (natsReq, error) {
	var r natsReq
	var pos []string
	for i := 0; i < len(a); i++ {
		switch {
		case a[i] == "-H":
			if i+1 == len(a) {
				return r, errors.New("-H without a header")
			}
			k, v, ok := strings.Cut(a[i+1], ":")
			if !ok {
				return r, fmt.Errorf("header %q is not Key:Value", a[i+1])
			}
			if r.header == nil {
				r.header = nats.Header{}
			}
			r.header.Add(k, strings.TrimSpace(v))
			i++
		case strings.HasPrefix(a[i], "-"):
			return r, fmt.Errorf("a nats req flag the test does not read (%s)", a[i])
		default:
			pos = append(pos, a[i])
		}
	}
	if len(pos) != 2 {
		return r, errors.New("nats req takes a subject and a body")
	}
	r.subject, r.body = pos[0], pos[1]
	return r, nil
}

// curlCmd is a curl command line.
type curlCmd struct {
	method, url string
	body        *string
	header      http.Header
	stream      bool // -N
}

func curlArgs(a []string) (curlCmd, error) {
	c := curlCmd{header: http.Header{}}
	for i := 0; i < len(a); i++ {
		switch a[i] {
		case "-d", "-X", "-H":
			if i+1 == len(a) {
				return c, fmt.Errorf("curl %s without its value", a[i])
			}
			v := a[i+1]
			switch a[i] {
			case "-d":
				c.body = &v
			case "-X":
				c.method = v
			case "-H":
				k, hv, ok := strings.Cut(v, ":")
				if !ok {
					return c, fmt.Errorf("header %q is not Key: Value", v)
				}
				c.header.Add(k, strings.TrimSpace(hv))
			}
			i++
		case "-N":
			c.stream = true
		default:
			if strings.HasPrefix(a[i], "-") || c.url != "" {
				return c, fmt.Errorf("a curl argument the test does not read (%s)", a[i])
			}
			c.url = a[i]
		}
	}
	if !strings.HasPrefix(c.url, "http://127.0.0.1:8080/") {
		return c, fmt.Errorf("curl of %q, not chime's http://127.0.0.1:8080/", c.url)
	}
	if c.method == "" {
		c.method = http.MethodGet
		if c.body != nil {
			c.method = http.MethodPost
		}
	}
	if c.body != nil && c.header.Get("Content-Type") == "" {
		c.header.Set("Content-Type", "application/x-www-form-urlencoded") // as curl -d sends
	}
	return c, nil
}

// readmeRun runs the steps, one after another, and keeps what they
// printed.
type readmeRun struct {
	t                 *testing.T
	nc                *nats.Conn
	natsURL, httpAddr string
	dir               string

	mu    sync.Mutex
	ids   map[string]string // the last ID of each kind printed
	bgs   []*bgCmd
	inbox *bgCmd // every envelope stored in an inbox
	mark  map[*bgCmd]int
}

// bgCmd is a command left running: a `nats sub`, or one ending with &.
type bgCmd struct {
	st   step
	mu   sync.Mutex
	out  []string // messages or lines, as they came
	stop func()   // ends it and waits for it
	done bool
}

func (b *bgCmd) add(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.out = append(b.out, s)
}

func (b *bgCmd) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.out)
}

func (r *readmeRun) fail(st step, format string, args ...any) {
	r.t.Helper()
	r.t.Errorf("README.md:%d: %s\n    %s", st.line, fmt.Sprintf(format, args...), st.text)
}

func (r *readmeRun) step(st step) {
	r.t.Helper()
	args, ok := r.fill(st)
	if !ok {
		return
	}
	r.markBg()
	switch args[0] {
	case "nats":
		r.natsStep(st, args)
	case "curl":
		r.curlStep(st, args)
	case "chime":
		r.chimeStep(st, args)
	}
}

var interventionRE = regexp.MustCompile(`"intervention_id":\s*"(iv_[0-9A-Za-z]+)"`)

// settle waits, after an intervention message or stop, until chime has
// applied it (its envelope is in the inbox): interventions are applied
// after the reply, and one applied late would cancel the wait a reader
// starts next, seconds later at a reader's pace.
func (r *readmeRun) settle(st step, out string) {
	r.t.Helper()
	m := interventionRE.FindStringSubmatch(out)
	if m == nil || !strings.Contains(st.text, "message") && !strings.Contains(st.text, "stop") {
		return
	}
	want := `"id":"intervention_` + m[1] + `"`
	deadline := time.Now().Add(10 * time.Second)
	for !slices.ContainsFunc(r.inbox.lines(), func(l string) bool { return strings.Contains(l, want) }) {
		if time.Now().After(deadline) {
			r.fail(st, "intervention %s not applied (its envelope not in the inbox) within 10s", m[1])
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var (
	idRE    = regexp.MustCompile(`(?:^|[^0-9A-Za-z])((tmr|wait|q|wf|mon|trg)_[0-9A-Za-z]{16,})`)
	tokenRE = regexp.MustCompile(`/(wake|enqueue)/(chime_cb_[0-9A-Za-z_-]{20,})`)
	placeRE = regexp.MustCompile(`\b(tmr|wait|q|wf|mon|trg)_\.\.\.`)
)

// see records the IDs in out, a command's output, as the last of their
// kind; notify, a notify reply, names the notification's.
func (r *readmeRun) see(out string, notify bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range idRE.FindAllStringSubmatch(out, -1) {
		r.ids[m[2]] = m[1]
	}
	for _, m := range tokenRE.FindAllStringSubmatch(out, -1) {
		r.ids["chime_cb_"+m[1]] = m[2]
	}
	var top map[string]any
	if json.Unmarshal([]byte(out), &top) == nil {
		if c, ok := top["next_cursor"].(string); ok {
			r.ids["next_cursor"] = c
		}
		if id, ok := top["id"].(string); ok && notify {
			r.ids["notification"] = id
		}
		if ds, ok := top["deliveries"].([]any); ok && len(ds) > 0 {
			if d, ok := ds[len(ds)-1].(map[string]any); ok {
				if seq, ok := d["seq"].(float64); ok {
					r.ids["seq"] = fmt.Sprint(int64(seq))
				}
			}
		}
	}
}

// fill replaces st's placeholders with the last IDs seen, waiting a
// little for one a background command has still to print.
func (r *readmeRun) fill(st step) ([]string, bool) {
	r.t.Helper()
	mode := "wake"
	if strings.Contains(st.text, "enqueue") {
		mode = "enqueue"
	}
	var missing string
	lookup := func(kind string) string {
		r.mu.Lock()
		defer r.mu.Unlock()
		id, ok := r.ids[kind]
		if !ok {
			missing = kind
		}
		return id
	}
	try := func() []string {
		missing = ""
		out := make([]string, len(st.args))
		for i, a := range st.args {
			a = placeRE.ReplaceAllStringFunc(a, func(p string) string { return lookup(strings.TrimSuffix(p, "_...")) })
			if strings.Contains(a, "chime_cb_...") {
				a = strings.ReplaceAll(a, "chime_cb_...", lookup("chime_cb_"+mode))
			}
			if strings.Contains(a, "<next_cursor>") {
				a = strings.ReplaceAll(a, "<next_cursor>", lookup("next_cursor"))
			}
			if strings.Contains(a, "<seq>") {
				a = strings.ReplaceAll(a, "<seq>", lookup("seq"))
			}
			if strings.Contains(a, "5b0c...") {
				a = strings.ReplaceAll(a, "5b0c...", lookup("notification"))
			}
			out[i] = a
		}
		return out
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := try()
		if missing == "" {
			for _, a := range out {
				if strings.Contains(a, "...") {
					r.fail(st, "a placeholder the test cannot fill in %q", a)
					return nil, false
				}
			}
			return out, true
		}
		if time.Now().After(deadline) {
			r.fail(st, "no earlier command printed the %s this one names", missing)
			return nil, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *readmeRun) natsStep(st step, args []string) {
	r.t.Helper()
	switch args[1] {
	case "sub":
		r.natsSub(st, args[2])
	case "micro":
		r.natsMicroLs(st)
	case "req":
		req, err := natsReqArgs(args[2:])
		if err != nil {
			r.fail(st, "%v", err)
			return
		}
		msg := nats.NewMsg(req.subject)
		msg.Data, msg.Header = []byte(req.body), req.header
		reply, err := r.nc.RequestMsg(msg, 15*time.Second)
		if err != nil {
			r.fail(st, "no reply: %v", err)
			return
		}
		out := string(reply.Data)
		if code := reply.Header.Get("Nats-Service-Error-Code"); code != "" || isErrorReply(out) {
			r.fail(st, "an error reply: %s %s", code, out)
			return
		}
		r.see(out, strings.HasSuffix(req.subject, ".notify"))
		r.logOut(st, out)
		r.settle(st, out)
		r.expect(st, []string{out})
	}
}

func (r *readmeRun) natsSub(st step, subject string) {
	r.t.Helper()
	b := &bgCmd{st: st}
	sub, err := r.nc.Subscribe(subject, func(m *nats.Msg) { b.add(string(m.Data)) })
	if err == nil {
		err = r.nc.Flush()
	}
	if err != nil {
		r.fail(st, "subscribe: %v", err)
		return
	}
	b.stop = func() { _ = sub.Unsubscribe() }
	r.addBg(b)
}

// natsMicroLs asks every service for its info, as `nats micro ls` does,
// and wants chime among them.
func (r *readmeRun) natsMicroLs(st step) {
	r.t.Helper()
	inbox := r.nc.NewRespInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := r.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		r.fail(st, "%v", err)
		return
	}
	defer sub.Unsubscribe()
	if err := r.nc.PublishRequest("$SRV.INFO", inbox, nil); err != nil {
		r.fail(st, "%v", err)
		return
	}
	timeout := time.After(time.Second)
	var names []string
	for {
		select {
		case m := <-ch:
			var info struct {
				Name string `json:"name"`
			}
			_ = json.Unmarshal(m.Data, &info)
			names = append(names, info.Name)
			if info.Name == "chime" {
				return
			}
		case <-timeout:
			r.fail(st, "no service chime answered $SRV.INFO (answered: %v)", names)
			return
		}
	}
}

func (r *readmeRun) curlStep(st step, args []string) {
	r.t.Helper()
	c, err := curlArgs(args[1:])
	if err != nil {
		r.fail(st, "%v", err)
		return
	}
	url := "http://" + r.httpAddr + strings.TrimPrefix(c.url, "http://127.0.0.1:8080")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var body io.Reader
	if c.body != nil {
		body = strings.NewReader(*c.body)
	}
	req, err := http.NewRequestWithContext(ctx, c.method, url, body)
	if err != nil {
		r.fail(st, "%v", err)
		return
	}
	req.Header = c.header
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		r.fail(st, "%v", err)
		return
	}
	defer res.Body.Close()
	if res.StatusCode/100 != 2 {
		b, _ := io.ReadAll(res.Body)
		r.fail(st, "HTTP %d: %s", res.StatusCode, b)
		return
	}
	if c.stream {
		// An event stream: it is one, and what it sends in its first
		// moments is read; then the reader's Ctrl-C.
		if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
			r.fail(st, "Content-Type %q, not an event stream", ct)
			return
		}
		var lines []string
		done := make(chan struct{})
		var mu sync.Mutex
		go func() {
			defer close(done)
			sc := bufio.NewScanner(res.Body)
			for sc.Scan() {
				if data, ok := strings.CutPrefix(sc.Text(), "data:"); ok {
					mu.Lock()
					lines = append(lines, strings.TrimSpace(data))
					mu.Unlock()
				}
			}
		}()
		time.Sleep(1500 * time.Millisecond)
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		r.logOut(st, strings.Join(lines, "\n"))
		r.expect(st, lines)
		return
	}
	b, err := io.ReadAll(res.Body)
	if err != nil {
		r.fail(st, "%v", err)
		return
	}
	out := string(b)
	if isErrorReply(out) {
		r.fail(st, "an error reply: %s", out)
		return
	}
	r.see(out, false)
	r.logOut(st, out)
	r.settle(st, out)
	r.expect(st, []string{out})
}

// chimeCmd is the built chime with args, as the reader runs it: in the
// work dir, speaking to the test's chime.
func (r *readmeRun) chimeCmd(args []string) *exec.Cmd {
	cmd := exec.Command(binary, args...)
	cmd.Dir = r.dir
	cmd.Env = append(cleanEnv(), "CHIME_NATS_URL="+r.natsURL, "CHIME_URL=http://"+r.httpAddr)
	return cmd
}

// streams reports whether a chime command runs until it is stopped (a
// wait, a follow, a watch).
func streams(args []string) bool {
	switch {
	case args[1] == "wait" && len(args) > 2 && strings.HasPrefix(args[2], "--"):
		return true
	case args[1] == "notify" && len(args) > 2 && args[2] == "follow":
		return true
	case args[1] == "inbox" && (slices.Contains(args, "watch") || slices.Contains(args, "--follow")):
		return true
	}
	return false
}

func (r *readmeRun) chimeStep(st step, args []string) {
	r.t.Helper()
	cmd := r.chimeCmd(args[1:])
	stdout, stderr := &testlog.Buffer{}, &testlog.Buffer{}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if st.bg {
		b := &bgCmd{st: st}
		pr, pw := io.Pipe()
		cmd.Stdout = pw
		if err := cmd.Start(); err != nil {
			r.fail(st, "%v", err)
			return
		}
		exited := make(chan struct{})
		read := make(chan struct{})
		go func() {
			defer close(read)
			sc := bufio.NewScanner(pr)
			for sc.Scan() {
				b.add(sc.Text())
				r.see(sc.Text(), false)
			}
		}()
		go func() { _ = cmd.Wait(); pw.Close(); close(exited) }()
		b.stop = func() {
			_ = cmd.Process.Signal(os.Interrupt)
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
			<-read
			if t := stderr.String(); strings.Contains(t, "chime:") {
				r.t.Logf("README.md:%d: stderr: %s", st.line, t)
			}
		}
		r.addBg(b)
		// The reader sees its first line (its ID) before going on.
		deadline := time.Now().Add(10 * time.Second)
		for len(b.lines()) == 0 {
			if time.Now().After(deadline) {
				r.fail(st, "printed nothing within 10s: %s", stderr)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		return
	}
	if err := cmd.Start(); err != nil {
		r.fail(st, "%v", err)
		return
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	if streams(args) {
		// It runs until the reader stops it: it still runs a moment
		// later, says what it says, and ends at Ctrl-C.
		select {
		case <-exited:
			r.fail(st, "ended at once (exit %d): %s%s", cmd.ProcessState.ExitCode(), stdout, stderr)
			return
		case <-time.After(1500 * time.Millisecond):
		}
		// A watch of an inbox that has deliveries prints them: given
		// time on a slow machine.
		for deadline := time.Now().Add(10 * time.Second); args[1] == "inbox" && strings.TrimSpace(stdout.String()) == "" && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			r.fail(st, "did not end within 5s of Ctrl-C")
			return
		}
		if args[1] == "wait" {
			if code := cmd.ProcessState.ExitCode(); code != 130 {
				r.fail(st, "exit %d at Ctrl-C, not 130: %s", code, stderr)
			}
			r.cancelledOnServer(st, args, stdout.String()+stderr.String())
		}
		if args[1] == "inbox" && strings.TrimSpace(stdout.String()) == "" {
			r.fail(st, "printed no delivery: %s", stderr)
		}
		r.logOut(st, stdout.String())
		r.expect(st, outputs(stdout.String()))
		return
	}
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		r.fail(st, "no exit within 20s")
		return
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		r.fail(st, "exit %d: %s%s", code, stdout, stderr)
		return
	}
	r.see(stdout.String(), false)
	r.logOut(st, stdout.String())
	r.settle(st, stdout.String())
	r.expect(st, outputs(stdout.String()))
}

// cancelledOnServer checks that the wait a `chime wait` named in out is
// cancelled on the server once the command has been interrupted.
func (r *readmeRun) cancelledOnServer(st step, args []string, out string) {
	r.t.Helper()
	m := idRE.FindStringSubmatch(out)
	if m == nil || m[2] != "wait" {
		r.fail(st, "printed no wait ID: %q", out)
		return
	}
	agent := "demo"
	if i := slices.Index(args, "--agent"); i > 0 && i+1 < len(args) {
		agent = args[i+1]
	}
	status := ""
	for deadline := time.Now().Add(5 * time.Second); status != "cancelled"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			r.fail(st, "wait %s is %q on the server after Ctrl-C, not cancelled", m[1], status)
			return
		}
		reply, err := r.nc.Request("agent."+agent+".wait.list", []byte(`{"limit":1000}`), 5*time.Second)
		if err != nil {
			continue
		}
		var list struct {
			Waits []struct {
				ID     string `json:"wait_id"`
				Status string `json:"status"`
			} `json:"waits"`
		}
		_ = json.Unmarshal(reply.Data, &list)
		for _, w := range list.Waits {
			if w.ID == m[1] {
				status = w.Status
			}
		}
	}
}

// outputs is a command's output as JSON documents: the whole, or each
// line.
func outputs(s string) []string {
	if json.Valid([]byte(s)) {
		return []string{s}
	}
	return strings.Split(s, "\n")
}

// logOut logs a command and the start of what it printed (go test -v).
func (r *readmeRun) logOut(st step, out string) {
	r.t.Helper()
	out = strings.TrimSpace(out)
	if len(out) > 300 {
		out = out[:300] + "..."
	}
	r.t.Logf("README.md:%d: %s\n    %s", st.line, st.text, out)
}

func (r *readmeRun) addBg(b *bgCmd) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bgs = append(r.bgs, b)
}

// markBg notes how much each background command has printed so far.
func (r *readmeRun) markBg() {
	r.mu.Lock()
	bgs := slices.Clone(r.bgs)
	r.mu.Unlock()
	r.mark = map[*bgCmd]int{}
	for _, b := range bgs {
		r.mark[b] = len(b.lines())
	}
}

// bgLines is what the background commands have printed since markBg.
func (r *readmeRun) bgLines() []string {
	r.mu.Lock()
	bgs := slices.Clone(r.bgs)
	r.mu.Unlock()
	var out []string
	for _, b := range bgs {
		out = append(out, b.lines()[r.mark[b]:]...)
	}
	return out
}

// expect checks the shapes of st's comment against its output (own): a
// shape not there must show, within a few seconds, in what a background
// command prints after st started (a `nats sub` of the inbox, say). A background
// command's shapes are checked against its own output when it stops.
func (r *readmeRun) expect(st step, own []string) {
	r.t.Helper()
	if st.bg {
		return
	}
	for _, sh := range shapes(st.comment) {
		if matchAny(sh, own) {
			continue
		}
		deadline := time.Now().Add(6 * time.Second)
		for !matchAny(sh, r.bgLines()) {
			if time.Now().After(deadline) {
				r.fail(st, "nothing it or a running subscription printed has the fields of the comment's %s; it printed:\n%s", sh.src, strings.Join(own, "\n"))
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// stopAll stops the background commands and checks each printed what its
// comment says.
func (r *readmeRun) stopAll() {
	r.t.Helper()
	r.mu.Lock()
	bgs := slices.Clone(r.bgs)
	r.mu.Unlock()
	for _, b := range bgs {
		if b.done {
			continue
		}
		for _, sh := range shapes(b.st.comment) {
			deadline := time.Now().Add(5 * time.Second)
			for !matchAny(sh, b.lines()) {
				if time.Now().After(deadline) {
					r.fail(b.st, "printed nothing with the fields of its comment's %s; it printed:\n%s", sh.src, strings.Join(b.lines(), "\n"))
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		b.stop()
		b.done = true
		r.logOut(b.st, fmt.Sprintf("(background: %d lines or messages) %s", len(b.lines()), strings.Join(b.lines(), "\n")))
	}
}

// isErrorReply reports whether s is chime's error document.
func isErrorReply(s string) bool {
	var top map[string]json.RawMessage
	if json.Unmarshal([]byte(s), &top) != nil {
		return false
	}
	_, bad := top["error"]
	return bad
}

// shape is what a README comment shows of a JSON document: its quoted
// keys (at any depth) and the values it spells out (true, false, and
// strings but those with ... or <placeholder>, times and measures).
type shape struct {
	src  string
	keys []string
	vals map[string]string
}

var (
	keyRE     = regexp.MustCompile(`"([A-Za-z_]+)":\s*("((?:[^"\\]|\\.)*)"|true|false)?`)
	bareKeyRE = regexp.MustCompile(`^\{\s*[a-z_]+(\s*,\s*[a-z_]+)+\s*\}$`)
	bareRE    = regexp.MustCompile(`[a-z_]+`)
	measureRE = regexp.MustCompile(`\d[.:]\d`) // a time or a remaining 29.0s: an example, not a value
)

// shapes reads the {...} of a comment.
func shapes(comment string) []shape {
	var out []shape
	for _, seg := range braces(comment) {
		sh := shape{src: seg, vals: map[string]string{}}
		if bareKeyRE.MatchString(seg) {
			sh.keys = bareRE.FindAllString(seg, -1)
		}
		for _, m := range keyRE.FindAllStringSubmatch(seg, -1) {
			sh.keys = append(sh.keys, m[1])
			switch v := m[2]; {
			case v == "true" || v == "false":
				sh.vals[m[1]] = v
			case strings.HasPrefix(v, `"`) && !strings.Contains(v, "...") && !strings.Contains(v, "<") && !measureRE.MatchString(v):
				sh.vals[m[1]] = m[3]
			}
		}
		if len(sh.keys) > 0 {
			out = append(out, sh)
		}
	}
	return out
}

// braces is each outermost {...} of s, but for request bodies ('{...}').
func braces(s string) []string {
	var out []string
	depth, start, inStr := 0, 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case inStr && c == '\\':
			i++
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '{' && depth == 0 && i > 0 && s[i-1] == '\'':
			// '{...}' is a request body, as on a command line.
			j := strings.IndexByte(s[i:], '\'')
			if j < 0 {
				return out
			}
			i += j
		case c == '{':
			if depth == 0 {
				start = i
			}
			depth++
		case c == '}' && depth > 0:
			depth--
			if depth == 0 {
				out = append(out, s[start:i+1])
			}
		}
	}
	return out
}

// matchAny reports whether one of docs has sh's keys and values.
func matchAny(sh shape, docs []string) bool {
	for _, d := range docs {
		var v any
		dec := json.NewDecoder(bytes.NewReader([]byte(d)))
		dec.UseNumber()
		if dec.Decode(&v) != nil {
			continue
		}
		keys, vals := map[string]bool{}, map[string]bool{}
		walkJSON(v, keys, vals)
		ok := true
		for _, k := range sh.keys {
			ok = ok && keys[k]
		}
		for k, want := range sh.vals {
			ok = ok && vals[k+"="+want]
		}
		if ok {
			return true
		}
	}
	return false
}

func walkJSON(v any, keys, vals map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			keys[k] = true
			switch x := x.(type) {
			case string:
				vals[k+"="+x] = true
			case bool:
				vals[fmt.Sprintf("%s=%t", k, x)] = true
			}
			walkJSON(x, keys, vals)
		}
	case []any:
		for _, x := range v {
			walkJSON(x, keys, vals)
		}
	}
}

// TestREADMEParse shows that the reading of the examples is strict: a
// line it does not understand fails with its line, unless marked not
// run; and how it reads [...], a|b, `;` and commands side by side.
func TestREADMEParse(t *testing.T) {
	head := "# x\n\n## Worked example with the `nats` CLI\n\n"
	write := func(body string) string {
		p := filepath.Join(t.TempDir(), "README.md")
		if err := os.WriteFile(p, []byte(head+body+"\n## Next\n\n    nope\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct{ body, want string }{
		{"    nats kv get b k\n", "README.md:5: a nats command the test does not run"},
		{"    wscat -c ws://127.0.0.1:8080/x\n", "README.md:5: a command the test does not run"},
		{"text\n\n    chime timer list\n    curl http://10.0.0.1/\n", "README.md:8: curl of"},
		{"    chime callback create | cancel ID\n", "README.md:5: an unquoted |"},
		{"    nats req a.b '{\n", "README.md:5: an unclosed '"},
		{"```\nchime timer list\n```\n", "README.md:5: a fenced block"},
	} {
		if _, _, err := readmeSteps(write(tc.body)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.body, err, tc.want)
		}
	}

	steps, env, err := readmeSteps(write(strings.Join([]string{
		"    wscat -c ws://127.0.0.1:8080/x   # not run: needs wscat",
		"    chime agent stop|start [--agent demo] [--mode M]   # both",
		"    # {\"ok\":true}",
		"    chime notify list [--since 12]; chime notify read [ID...]",
		"    chime task get b-1      chime intervene text=\"a  b\"     nats sub 'x.y' &",
		"    # with CHIME_MONITOR_SUBJECTS='ci.>':",
		"    nats req a.monitor.start '{\"ws\":\"wss://ci.example.com/x\"}'",
	}, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, st := range steps {
		s := fmt.Sprintf("%d %q", st.line, st.args)
		if st.bg {
			s += " &"
		}
		if st.notRun != "" {
			s += " not run: " + st.notRun
		}
		if st.comment != "" {
			s += " # " + st.comment
		}
		got = append(got, s)
	}
	want := []string{
		`5 ["wscat" "-c" "ws://127.0.0.1:8080/x"] not run: needs wscat # not run: needs wscat`,
		`6 ["chime" "agent" "stop" "--agent" "demo"]`,
		`6 ["chime" "agent" "start" "--agent" "demo"] # both {"ok":true}`,
		`8 ["chime" "notify" "list" "--since" "12"]`,
		`8 ["chime" "notify" "read"]`,
		`9 ["chime" "task" "get" "b-1"]`,
		`9 ["chime" "intervene" "text=a  b"]`,
		`9 ["nats" "sub" "x.y"] & # with CHIME_MONITOR_SUBJECTS='ci.>':`,
		`11 ["nats" "req" "a.monitor.start" "{\"ws\":\"wss://ci.example.com/x\"}"] not run: it needs the reader's own system (ci.example.com)`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("steps:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !slices.Equal(env, []string{"CHIME_MONITOR_SUBJECTS=ci.>"}) {
		t.Errorf("env %q", env)
	}
}
