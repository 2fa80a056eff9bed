package prompts

import (
	"fmt"
	"regexp"
	"strings"
)

// Argument is one argument a tool prompt documents in its "## Arguments"
// section: a line "- `name` (type, required|optional[ for verb and verb]):
// what it is", then optionally "  values: `a`, `b`".
type Argument struct {
	Name string
	// Type is the JSON type the prompt names: string, integer, boolean,
	// array or object.
	Type     string
	Required bool
	// For are the verbs "required for ..." names; nil is every verb.
	For []string
	// Values are the documented values of an enumeration.
	Values []string
	// Priority is a documented `priority values:` line.
	Priority string
	// Text is what the argument is, as the prompt says it.
	Text string
}

// Applies reports whether the argument belongs to verb.
func (a *Argument) Applies(verb string) bool {
	if a.For == nil {
		return true
	}
	for _, v := range a.For {
		if v == verb {
			return true
		}
	}
	return false
}

var (
	argLine      = regexp.MustCompile("^- `([a-z_]+)` \\(([a-z]+), (required|optional)(?: for ([a-z ]+))?\\)(?::\\s*(.*))?$")
	valuesLine   = regexp.MustCompile(`^\s+values: (.+)$`)
	priorityLine = regexp.MustCompile(`^\s+priority values: (.+)$`)
	quoted       = regexp.MustCompile("`([^`]+)`")
)

// Arguments parses a tool prompt's "## Arguments" section, in order.
func Arguments(name string) ([]Argument, error) {
	text, err := Get(name)
	if err != nil {
		return nil, err
	}
	_, section, ok := strings.Cut(text, "\n## Arguments\n")
	if !ok {
		return nil, fmt.Errorf("prompts: %s has no ## Arguments section", name)
	}
	section, _, _ = strings.Cut(section, "\n\n")
	var args []Argument
	for _, line := range strings.Split(strings.TrimRight(section, "\n"), "\n") {
		if m := argLine.FindStringSubmatch(line); m != nil {
			a := Argument{Name: m[1], Type: m[2], Required: m[3] == "required", Text: m[5]}
			if m[4] != "" {
				a.For = strings.Split(m[4], " and ")
			}
			args = append(args, a)
			continue
		}
		if len(args) == 0 {
			return nil, fmt.Errorf("prompts: %s: line outside an argument: %q", name, line)
		}
		last := &args[len(args)-1]
		if m := priorityLine.FindStringSubmatch(line); m != nil {
			last.Priority = m[1]
		} else if m := valuesLine.FindStringSubmatch(line); m != nil {
			for _, q := range quoted.FindAllStringSubmatch(m[1], -1) {
				last.Values = append(last.Values, q[1])
			}
		} else {
			return nil, fmt.Errorf("prompts: %s: unparsed argument line %q", name, line)
		}
	}
	return args, nil
}

// Intro is a tool prompt's first paragraph: what the tool is for and when
// to use it, one line.
func Intro(name string) (string, error) {
	text, err := Get(name)
	if err != nil {
		return "", err
	}
	_, rest, _ := strings.Cut(text, "\n\n") // past the "# title" line
	para, _, _ := strings.Cut(strings.TrimSpace(rest), "\n\n")
	return strings.Join(strings.Fields(para), " "), nil
}
