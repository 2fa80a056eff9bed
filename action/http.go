package action

import (
	"encoding/json"
	"net/http"

	"github.com/chime-nats/chime/subjects"
)

// The Body makers of routes: each turns an HTTP request into the JSON
// body its action decodes, so that the rules and error texts of both
// surfaces are one.

// NoBody passes no body, whatever was sent.
func NoBody(*http.Request, []byte) []byte { return nil }

// Query passes the named query parameters that are set as a JSON object
// (see RawOrString).
func Query(names ...string) func(*http.Request, []byte) []byte {
	return func(r *http.Request, _ []byte) []byte { return WithQuery(r, map[string]any{}, names...) }
}

// Path passes path values as string fields of a JSON object (fields maps
// each field to the path value it takes), with the named query parameters.
func Path(fields map[string]string, query ...string) func(*http.Request, []byte) []byte {
	return func(r *http.Request, _ []byte) []byte {
		m := map[string]any{}
		for field, value := range fields {
			m[field] = r.PathValue(value)
		}
		return WithQuery(r, m, query...)
	}
}

// PathField passes the request's body with field set to the path value
// of the same name (see subjects.WithField).
func PathField(field string) func(*http.Request, []byte) []byte {
	return func(r *http.Request, read []byte) []byte { return subjects.WithField(read, field, r.PathValue(field)) }
}

// List is a listing's ?limit and ?cursor as its body: the limit as Query
// passes it, the cursor always as a string.
func List(r *http.Request, _ []byte) []byte {
	m := map[string]any{}
	if c := r.URL.Query().Get("cursor"); c != "" {
		m["cursor"] = c
	}
	return WithQuery(r, m, "limit")
}

// WithQuery adds the named query parameters that are set to m and encodes
// it; an empty m is no body.
func WithQuery(r *http.Request, m map[string]any, names ...string) []byte {
	q := r.URL.Query()
	for _, name := range names {
		if v := q.Get(name); v != "" {
			m[name] = RawOrString(v)
		}
	}
	if len(m) == 0 {
		return nil
	}
	b, _ := json.Marshal(m) // strings and valid raw JSON only: no error
	return b
}

// RawOrString passes a query value that looks like a number as a JSON
// number and anything else as a string, for the decoder to refuse in its
// own words.
func RawOrString(v string) any {
	for i := 0; i < len(v); i++ {
		if (v[i] < '0' || v[i] > '9') && v[i] != '-' && v[i] != '.' {
			return v
		}
	}
	if !json.Valid([]byte(v)) {
		return v // "-", "1.2.3": a string, refused as one
	}
	return RawJSON(v)
}

// RawBoolOrString passes true and false as JSON booleans and anything
// else as a string.
func RawBoolOrString(v string) any {
	if v == "true" || v == "false" {
		return RawJSON(v)
	}
	return v
}

// RawJSON is a value encoded as it is.
type RawJSON string

// MarshalJSON returns n as it is.
func (n RawJSON) MarshalJSON() ([]byte, error) { return []byte(n), nil }
