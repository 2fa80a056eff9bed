package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"unicode/utf8"
)

// columnsOf are the table columns the action name declares.
func columnsOf(name string) []string {
	if a, ok := actionTable().Lookup(name); ok {
		return a.Columns
	}
	return nil
}

// maxCell bounds a table cell: a summary or a question runs on in the
// JSON (--json), not across the terminal.
const maxCell = 48

// printTable prints each list in reply (a top-level array of records) as
// a table of the columns its records have, in the order given, and the
// reply's next_cursor after them. It reports false, printing nothing,
// when reply holds no list.
func printTable(w io.Writer, reply []byte, columns []string) (bool, error) {
	var top map[string]json.RawMessage
	if len(reply) > 0 && reply[0] == '[' {
		top = map[string]json.RawMessage{"": reply} // a bare list
	} else if err := json.Unmarshal(reply, &top); err != nil {
		return false, nil
	}
	var lists []string
	for name, raw := range top {
		if len(raw) > 0 && raw[0] == '[' {
			lists = append(lists, name)
		}
	}
	if len(lists) == 0 {
		return false, nil
	}
	slices.Sort(lists)
	for i, name := range lists {
		var items []map[string]json.RawMessage
		if err := json.Unmarshal(top[name], &items); err != nil {
			return false, nil // not records: the JSON says it better
		}
		if len(lists) > 1 {
			if i > 0 {
				fmt.Fprintln(w)
			}
			fmt.Fprintf(w, "%s (%d)\n", name, len(items))
		}
		if err := writeRows(w, items, present(items, columns)); err != nil {
			return true, err
		}
	}
	var next string
	if raw, ok := top["next_cursor"]; ok && json.Unmarshal(raw, &next) == nil && next != "" {
		fmt.Fprintf(w, "\nmore: cursor=%s\n", next)
	}
	return true, nil
}

// present are the columns some item has.
func present(items []map[string]json.RawMessage, columns []string) []string {
	var cols []string
	for _, c := range columns {
		for _, it := range items {
			if v, ok := it[c]; ok && string(v) != "null" {
				cols = append(cols, c)
				break
			}
		}
	}
	return cols
}

func writeRows(w io.Writer, items []map[string]json.RawMessage, cols []string) error {
	if len(items) == 0 {
		_, err := fmt.Fprintln(w, "(none)")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.ToUpper(strings.Join(cols, "\t")))
	for _, it := range items {
		cells := make([]string, len(cols))
		for i, c := range cols {
			cells[i] = cell(it[c])
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// cell is a value as one short line: a string as it is, anything else as
// its JSON, cut at maxCell runes.
func cell(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return "-"
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		s = string(raw)
	}
	s = strings.Join(strings.Fields(s), " ") // no tabs or newlines in a row
	if utf8.RuneCountInString(s) > maxCell {
		s = string([]rune(s)[:maxCell-1]) + "…"
	}
	if s == "" {
		return `""`
	}
	return s
}
