package api_test

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/chime-nats/chime/api"
)

var update = flag.Bool("update", false, "rewrite docs/contract.md's generated action table")

// contractPath is the contract, whose action table is generated.
const contractPath = "../docs/contract.md"

// TestContractActionTable: the contract's table of actions is the action
// table's, so the two cannot drift; -update rewrites it.
func TestContractActionTable(t *testing.T) {
	doc, err := os.ReadFile(contractPath)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- actions:begin", "<!-- actions:end -->"
	text := string(doc)
	i, j := strings.Index(text, begin), strings.Index(text, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q ... %q block", contractPath, begin, end)
	}
	i += strings.Index(text[i:], "\n") + 1
	want := api.NewOperations(api.Config{}).Table().Markdown()
	if text[i:j] == want {
		return
	}
	if !*update {
		t.Fatalf("%s's action table differs from the declared actions; run go test ./api -run TestContractActionTable -update\nwant:\n%s", contractPath, want)
	}
	if err := os.WriteFile(contractPath, []byte(text[:i]+want+text[j:]), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestActionsAreComplete: every action says what it does and serves a
// surface.
func TestActionsAreComplete(t *testing.T) {
	for _, a := range api.NewOperations(api.Config{}).Table().All() {
		if a.Summary == "" {
			t.Errorf("%s has no summary", a.Name)
		}
		if a.HTTP == nil && !a.OnNATS() {
			t.Errorf("%s is served nowhere", a.Name)
		}
	}
}
