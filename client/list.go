package client

import (
	"context"
	"fmt"
)

// listRequest is the body of a listing: limit 0 and cursor "" are left
// for the server's default and the first page.
func listRequest(limit int, cursor string) map[string]any {
	req := map[string]any{}
	if limit > 0 {
		req["limit"] = limit
	}
	if cursor != "" {
		req["cursor"] = cursor
	}
	return req
}

// maxPages bounds a walk through every page: a listing that keeps
// changing under the walk could otherwise keep it going.
const maxPages = 10_000

// all reads every page of a listing through page and returns each record
// once, as last read (a record changed after its page comes again), where
// it first came.
func all[T any](ctx context.Context, page func(context.Context, string) ([]T, string, error), id func(*T) string) ([]T, error) {
	out := []T{}
	at := map[string]int{}
	cursor := ""
	for range maxPages {
		items, next, err := page(ctx, cursor)
		if err != nil {
			return nil, err
		}
		for _, v := range items {
			if i, ok := at[id(&v)]; ok {
				out[i] = v
				continue
			}
			at[id(&v)] = len(out)
			out = append(out, v)
		}
		if next == "" {
			return out, nil
		}
		cursor = next
	}
	return nil, fmt.Errorf("the listing did not end within %d pages", maxPages)
}
