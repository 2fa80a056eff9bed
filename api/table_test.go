package api_test

import (
	"flag"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/api"
)

var update = flag.Bool("update", false, "rewrite what is generated from the action table: docs/contract.md's table, the chart's responder permissions")

// contractPath is the contract, whose action table is generated.
const contractPath = "../docs/contract.md"

// TestContractActionTable: the contract's table of actions is the action
// table's, so the two cannot drift; -update rewrites it.
func TestContractActionTable(t *testing.T) {
	doc, err := os.ReadFile(contractPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "description `"+api.ServiceDescription+"`") {
		t.Errorf("%s does not give the micro service's description %q", contractPath, api.ServiceDescription)
	}
	table := api.NewOperations(api.Config{}).Table()
	checkGenerated(t, "actions", table.Markdown())
	checkGenerated(t, "tools", table.ToolsMarkdown())
}

// checkGenerated holds the contract's <!-- name:begin ... --> block to
// want, or rewrites it with -update.
func checkGenerated(t *testing.T, name, want string) {
	t.Helper()
	doc, err := os.ReadFile(contractPath)
	if err != nil {
		t.Fatal(err)
	}
	begin, end := "<!-- "+name+":begin", "<!-- "+name+":end -->"
	text := string(doc)
	i, j := strings.Index(text, begin), strings.Index(text, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q ... %q block", contractPath, begin, end)
	}
	i += strings.Index(text[i:], "\n") + 1
	if text[i:j] == want {
		return
	}
	if !*update {
		t.Fatalf("%s's %s table differs from the declared actions; run go test ./api -run TestContractActionTable -update\nwant:\n%s", contractPath, name, want)
	}
	if err := os.WriteFile(contractPath, []byte(text[:i]+want+text[j:]), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestActionsAreComplete: every action says what it does, takes and
// answers, and serves a surface.
func TestActionsAreComplete(t *testing.T) {
	for _, a := range api.NewOperations(api.Config{}).Table().All() {
		if a.Summary == "" || a.Body == "" || a.Reply == "" {
			t.Errorf("%s does not say what it does, takes and answers (Summary, Body, Reply)", a.Name)
		}
		if a.HTTP == nil && !a.OnNATS() {
			t.Errorf("%s is served nowhere", a.Name)
		}
	}
}

// chartPath holds the responder's permissions, derived from the table.
const chartPath = "../helm/chime/values-production.yaml"

// TestChartResponderPermissions: the production values carry the
// responder's permissions; they must be exactly what chime nats-config
// prints, or the responder cannot serve (or may do more); -update
// rewrites them.
func TestChartResponderPermissions(t *testing.T) {
	b, err := os.ReadFile(chartPath)
	if err != nil {
		t.Fatal(err)
	}
	quote := func(ss []string) string {
		q := make([]string, len(ss))
		for i, s := range ss {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	text := string(b)
	for what, want := range map[string]string{
		"publish":   "publish: {allow: " + quote(access.ResponderPublish()) + "}",
		"subscribe": "subscribe: {allow: " + quote(access.ResponderSubscribe(api.Rights())) + "}",
	} {
		if strings.Contains(text, want) {
			continue
		}
		line := regexp.MustCompile(`(?m)^(\s*)` + what + `: \{allow: \[.*\]\}$`)
		if !*update || len(line.FindAllString(text, -1)) != 1 {
			t.Errorf("%s: the responder's %s permissions differ from chime nats-config's (go test ./api -run TestChartResponderPermissions -update rewrites them): want %s", chartPath, what, want)
			continue
		}
		text = line.ReplaceAllString(text, "${1}"+strings.ReplaceAll(want, "$", "$$"))
	}
	if *update && text != string(b) {
		if err := os.WriteFile(chartPath, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
