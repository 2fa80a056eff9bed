package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/questions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
	"github.com/chime-nats/chime/timers"
)

// TestTimerListPages pages through an agent's timers while timers are
// created and cancelled between the pages: every timer there from the
// first page to the last comes, once if it did not change meanwhile, again
// (cancelled) if it was cancelled after its page; those created come once;
// and HTTP pages the same way.
func TestTimerListPages(t *testing.T) {
	r, nc := startChime(t)
	base := "http://" + r.HTTPAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _ := client.New(nc, "pager")
	var before []string
	for i := range 25 {
		tm, err := c.CreateTimer(ctx, 3_600_000, 0, fmt.Sprint("t", i))
		if err != nil {
			t.Fatal(err)
		}
		before = append(before, tm.ID)
	}

	seen := map[string][]timers.TimerStatus{}
	changed := map[string]bool{}
	var created []string
	cursor, pages := "", 0
	for {
		page, err := c.TimersPage(ctx, 10, cursor)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, tm := range page.Timers {
			seen[tm.ID] = append(seen[tm.ID], tm.Status)
		}
		if page.NextCursor == "" {
			break
		}
		if pages > 10 {
			t.Fatal("the listing does not end")
		}
		cursor = page.NextCursor
		if pages <= 2 {
			// Cancel one listed, one not listed yet; create one.
			for _, id := range []string{page.Timers[0].ID, before[len(before)-pages]} {
				if _, err := c.CancelTimer(ctx, id); err != nil {
					t.Fatal(err)
				}
				changed[id] = true
			}
			tm, err := c.CreateTimer(ctx, 3_600_000, 0, "between pages")
			if err != nil {
				t.Fatal(err)
			}
			created = append(created, tm.ID)
		}
	}
	for _, id := range append(before, created...) {
		got := seen[id]
		switch {
		case len(got) == 0:
			t.Errorf("%s never listed", id)
		case !changed[id] && len(got) != 1:
			t.Errorf("%s, unchanged, listed %d times", id, len(got))
		case changed[id] && (len(got) > 2 || got[len(got)-1] != timers.TimerCancelled):
			t.Errorf("%s, cancelled during the walk, listed as %v", id, got)
		}
	}
	if len(seen) != len(before)+len(created) {
		t.Errorf("%d timers listed, want %d", len(seen), len(before)+len(created))
	}

	// HTTP: the same pages, by ?limit and ?cursor.
	var all []string
	cursor = ""
	for range 10 {
		path := "/api/agents/pager/timers?limit=11"
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		status, body := get(t, base+path)
		var page timers.ListTimersReply
		if status != 200 || json.Unmarshal(body, &page) != nil || len(page.Timers) > 11 {
			t.Fatalf("GET %s: %d %s", path, status, body)
		}
		for _, tm := range page.Timers {
			all = append(all, tm.ID)
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if len(all) != len(before)+len(created) {
		t.Errorf("HTTP pages listed %d timers, want %d", len(all), len(before)+len(created))
	}
	every, err := c.AllTimers(ctx)
	if err != nil || len(every) != len(all) {
		t.Errorf("AllTimers: %d, %v", len(every), err)
	}
}

// TestOtherListsPage: wait.list pages its two kinds together (at most
// limit of each), task.list and question.list (open ones only by default)
// page as timer.list does.
func TestOtherListsPage(t *testing.T) {
	_, nc := startChime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _ := client.New(nc, "lists")
	for range 3 {
		request(t, nc, "agent.lists.wait.request", `{"seconds":600}`)
	}
	for i := range 2 {
		msg := request(t, nc, "agent.lists.wait.for", fmt.Sprintf(`{"wake":"external","resource":"ci%d","reason":"r","delivery":"final"}`, i))
		assertNoError(t, "wait.for", msg.Data)
	}
	p1, err := c.WaitsPage(ctx, 2, "")
	if err != nil || len(p1.Waits) != 2 || len(p1.WaitFor) != 2 || p1.NextCursor == "" {
		t.Fatalf("wait.list page 1: %+v %v", p1, err)
	}
	p2, err := c.WaitsPage(ctx, 2, p1.NextCursor)
	if err != nil || len(p2.Waits) != 1 || len(p2.WaitFor) != 0 || p2.NextCursor != "" {
		t.Fatalf("wait.list page 2: %+v %v", p2, err)
	}

	for i := range 3 {
		assertNoError(t, "task.start", request(t, nc, "agent.lists.task.start", fmt.Sprintf(`{"task_id":"k%d"}`, i)).Data)
	}
	tp, err := c.TasksPage(ctx, 2, "")
	if err != nil || len(tp.Tasks) != 2 || tp.Tasks[0].ID != "k0" || tp.NextCursor == "" {
		t.Fatalf("task.list page 1: %+v %v", tp, err)
	}
	if tp, err = c.TasksPage(ctx, 2, tp.NextCursor); err != nil || len(tp.Tasks) != 1 || tp.Tasks[0].ID != "k2" || tp.NextCursor != "" {
		t.Fatalf("task.list page 2: %+v %v", tp, err)
	}

	var asked []string
	for i := range 3 {
		a, err := c.Ask(ctx, questions.QuestionItem{Title: fmt.Sprint("q", i)})
		if err != nil {
			t.Fatal(err)
		}
		asked = append(asked, a.QuestionID)
	}
	if _, err := c.Answer(ctx, asked[0], "done"); err != nil {
		t.Fatal(err)
	}
	var open []string
	cursor := ""
	for range 10 {
		qp, err := c.QuestionsPage(ctx, false, 1, cursor)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qp.Questions {
			open = append(open, q.ID)
		}
		if cursor = qp.NextCursor; cursor == "" {
			break
		}
	}
	if fmt.Sprint(open) != fmt.Sprint(asked[1:]) {
		t.Errorf("open questions by pages of 1: %v, want %v", open, asked[1:])
	}
	if list, err := c.ListQuestions(ctx, true); err != nil || len(list) != 3 {
		t.Errorf("every question: %d %v", len(list), err)
	}
}

// TestListBadInput: a bad limit or cursor is invalid_request naming what
// is wrong, over NATS and HTTP alike.
func TestListBadInput(t *testing.T) {
	r, nc := startChime(t)
	base := "http://" + r.HTTPAddr()
	taskCursor := subjects.EncodeCursor(tasks.ActionTaskList, subjects.CursorPos{Buckets: 1, Seq: 3})
	stale := subjects.EncodeCursor(subjects.ActionTimerList, subjects.CursorPos{Buckets: 4, Bucket: 1, Seq: 3})
	for _, tc := range []struct{ action, query, body, msg string }{
		{"timer.list", "limit=0", `{"limit":0}`, "limit must be a positive integer, not 0"},
		{"timer.list", "limit=1001", `{"limit":1001}`, "limit is too large: at most 1000"},
		{"timer.list", "cursor=garbage", `{"cursor":"garbage"}`, "cursor is not a next_cursor chime gave: list again without a cursor"},
		{"timer.list", "cursor=" + taskCursor, `{"cursor":"` + taskCursor + `"}`, "cursor is from a task.list listing, not timer.list"},
		{"timer.list", "cursor=" + stale, `{"cursor":"` + stale + `"}`, "cursor is from a listing over another number of partitions: list again without a cursor"},
		{"task.list", "cursor=123", `{"cursor":123}`, "cursor must be a JSON string, not number"},
		{"wait.list", "cursor=" + taskCursor, `{"cursor":"` + taskCursor + `"}`, "cursor is from a task.list listing, not wait.list"},
		{"question.list", "cursor=x", `{"cursor":"x"}`, "cursor is not a next_cursor chime gave: list again without a cursor"},
	} {
		msg := request(t, nc, "agent.bad."+tc.action, tc.body)
		assertError(t, tc.action+" "+tc.body, msg.Data, subjects.CodeInvalidRequest, tc.msg)
		if tc.body == `{"cursor":123}` {
			continue // a query value is a string
		}
		path := map[string]string{"timer.list": "timers", "task.list": "tasks", "wait.list": "waits", "question.list": "questions"}[tc.action]
		status, body := get(t, base+"/api/agents/bad/"+path+"?"+tc.query)
		if status != 400 {
			t.Errorf("GET %s?%s: %d %s", path, tc.query, status, body)
		}
		assertError(t, "GET "+path+"?"+tc.query, body, subjects.CodeInvalidRequest, tc.msg)
	}
}

func assertNoError(t *testing.T, what string, body []byte) {
	t.Helper()
	var reply subjects.ErrorReply
	if json.Unmarshal(body, &reply) == nil && reply.Error != nil {
		t.Fatalf("%s: %s", what, body)
	}
}
