package subjects

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Listings (timer.list, task.list, wait.list, question.list) are paged:
// {limit?, cursor?} asks for a page, and the reply's next_cursor is where
// the next one starts ("" after the last). A request without a cursor gets
// the first page, as before there were cursors.

// MaxCursorLen bounds a cursor's text; chime's are far shorter.
const MaxCursorLen = 256

// cursorVersion starts every cursor's text, so that a later layout can
// tell an old cursor from its own.
const cursorVersion = "1"

// ListRequest is the body of a paged listing.
type ListRequest struct {
	Limit json.RawMessage `json:"limit"`
	// Cursor is a next_cursor of an earlier page of the same listing.
	Cursor string `json:"cursor,omitempty"`
}

// CursorPos is where one walk of a listing resumes: the walk is over an
// ordered list of Buckets buckets (partitions); Bucket is the index of the
// one to read, Seq the stream sequence in it to read from, and Scan how
// (see kvrec.Pos). The zero CursorPos is a walk's start, Bucket == Buckets
// its end. (Its fields are those of kvrec.Pos, which it converts to.)
type CursorPos struct {
	Buckets int
	Bucket  int
	Seq     uint64
	Scan    bool
}

// End reports whether p is the end of its walk.
func (p CursorPos) End() bool { return p.Buckets > 0 && p.Bucket >= p.Buckets }

// ListPage is a decoded listing request.
type ListPage struct {
	Limit int
	// From holds one position per walk of the listing (wait.list walks
	// the waits and the WaitFor registrations); nil is the first page.
	From []CursorPos
}

// Walk is where walk i of the listing starts.
func (p ListPage) Walk(i int) CursorPos {
	if p.From == nil {
		return CursorPos{}
	}
	return p.From[i]
}

// DecodeListPage decodes the body of action, a listing with walks walks:
// its limit (DefaultListLimit when absent) and its cursor.
func DecodeListPage(action string, walks int, data []byte) (ListPage, error) {
	var r ListRequest
	if err := DecodeStrict(data, &r); err != nil {
		return ListPage{}, err
	}
	return r.Page(action, walks)
}

// Page validates the request's limit and cursor for a listing of action.
func (r *ListRequest) Page(action string, walks int) (ListPage, error) {
	limit, err := ParseLimit(r.Limit)
	if err != nil {
		return ListPage{}, err
	}
	from, err := ParseCursor(action, walks, r.Cursor)
	if err != nil {
		return ListPage{}, err
	}
	return ListPage{Limit: limit, From: from}, nil
}

// EncodeCursor is the next_cursor of a page of action whose walks go on
// from next: "" when every walk is at its end.
func EncodeCursor(action string, next ...CursorPos) string {
	done := true
	parts := make([]string, len(next))
	for i, p := range next {
		done = done && p.End()
		parts[i] = fmt.Sprintf("%d.%d.%d", p.Buckets, p.Bucket, p.Seq)
		if p.Scan {
			parts[i] += ".s"
		}
	}
	if done {
		return ""
	}
	text := cursorVersion + "|" + action + "|" + strings.Join(parts, ",")
	return base64.RawURLEncoding.EncodeToString([]byte(text))
}

// ParseCursor reads a cursor of action, a listing with walks walks; ""
// is the first page (nil).
func ParseCursor(action string, walks int, cursor string) ([]CursorPos, error) {
	if cursor == "" {
		return nil, nil
	}
	if len(cursor) > MaxCursorLen {
		return nil, Invalid(fmt.Sprintf("cursor is too long: at most %d characters", MaxCursorLen))
	}
	malformed := Invalid("cursor is not a next_cursor chime gave: list again without a cursor")
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return nil, malformed
	}
	fields := strings.Split(string(raw), "|")
	if len(fields) != 3 || fields[0] != cursorVersion {
		return nil, malformed
	}
	if fields[1] != action {
		return nil, Invalid(fmt.Sprintf("cursor is from a %s listing, not %s", fields[1], action))
	}
	parts := strings.Split(fields[2], ",")
	if len(parts) != walks {
		return nil, malformed
	}
	out := make([]CursorPos, walks)
	for i, part := range parts {
		nums := strings.Split(part, ".")
		scan := len(nums) == 4 && nums[3] == "s"
		if len(nums) != 3 && !scan {
			return nil, malformed
		}
		buckets, err1 := strconv.Atoi(nums[0])
		bucket, err2 := strconv.Atoi(nums[1])
		seq, err3 := strconv.ParseUint(nums[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || buckets < 1 || bucket < 0 || bucket > buckets {
			return nil, malformed
		}
		out[i] = CursorPos{Buckets: buckets, Bucket: bucket, Seq: seq, Scan: scan}
	}
	return out, nil
}

// ErrCursorStale is the error of a cursor whose walk no longer fits the
// listing: it was given over another number of partitions.
func ErrCursorStale() *Error {
	return Invalid("cursor is from a listing over another number of partitions: list again without a cursor")
}

// DefaultListLimit and MaxListLimit bound every listing's page.
const (
	DefaultListLimit = 50
	MaxListLimit     = 1000
)

// ParseLimit validates a listing limit; absent means DefaultListLimit.
func ParseLimit(raw json.RawMessage) (int, error) {
	if IsNull(raw) {
		return DefaultListLimit, nil
	}
	n, err := PositiveInt("limit", raw, MaxListLimit)
	return int(n), err
}
