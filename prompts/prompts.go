package prompts

import (
	"embed"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

//go:embed *.md
var files embed.FS

// ErrUnknownPrompt is returned for a name no prompt has.
var ErrUnknownPrompt = errors.New("unknown prompt")

// ErrMissingVar is returned when a placeholder has no value.
var ErrMissingVar = errors.New("missing prompt variable")

// Get returns a prompt's markdown, e.g. Get("wait.md").
func Get(name string) (string, error) {
	b, err := files.ReadFile(name)
	if err != nil {
		return "", fmt.Errorf("prompts: %w: %s", ErrUnknownPrompt, name)
	}
	return string(b), nil
}

var placeholder = regexp.MustCompile(`\{\{\s*([a-z_]+)\s*\}\}`)

// Render fills a prompt's {{name}} placeholders from vars and trims the
// trailing newline, so a one-line framework message renders as that line.
func Render(name string, vars map[string]string) (string, error) {
	text, err := Get(name)
	if err != nil {
		return "", err
	}
	var missing []string
	out := placeholder.ReplaceAllStringFunc(text, func(m string) string {
		key := placeholder.FindStringSubmatch(m)[1]
		v, ok := vars[key]
		if !ok {
			missing = append(missing, key)
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("prompts: %s: %w: %s", name, ErrMissingVar, strings.Join(missing, ", "))
	}
	return strings.TrimRight(out, " \n"), nil
}
