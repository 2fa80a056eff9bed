package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/questions"
	"github.com/chime-nats/chime/subjects"
)

// inboxEnvelopes reads every envelope stored in the agent's inbox stream.
func inboxEnvelopes(t *testing.T, nc *nats.Conn, agent string) []subjects.Envelope {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	cons, err := js.OrderedConsumer(ctx, engine.InboxStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subjects.Inbox(agent)}})
	if err != nil {
		t.Fatal(err)
	}
	var out []subjects.Envelope
	for left := cons.CachedInfo().NumPending; left > 0; left-- {
		m, err := cons.Next(jetstream.FetchMaxWait(2 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var env subjects.Envelope
		if err := json.Unmarshal(m.Data(), &env); err != nil {
			t.Fatal(err)
		}
		if m.Headers().Get(subjects.HeaderMsgID) != env.ID || m.Headers().Get(subjects.HeaderKind) != env.Kind {
			t.Errorf("headers %v of envelope %s", m.Headers(), env.ID)
		}
		out = append(out, env)
	}
	return out
}

// answersIn returns the answer envelopes of question qid in the agent's inbox.
func answersIn(t *testing.T, nc *nats.Conn, agent, qid string) []subjects.Envelope {
	t.Helper()
	var out []subjects.Envelope
	for _, env := range inboxEnvelopes(t, nc, agent) {
		if env.Kind == subjects.KindAnswer && env.Source.ID == qid {
			out = append(out, env)
		}
	}
	return out
}

// oneAnswer checks that the inbox holds exactly one answer to qid, with
// these answers, and returns it.
func oneAnswer(t *testing.T, nc *nats.Conn, agent, qid string, answers ...string) subjects.Envelope {
	t.Helper()
	got := answersIn(t, nc, agent, qid)
	if len(got) != 1 {
		t.Fatalf("%d answer envelopes for %s, want 1: %+v", len(got), qid, got)
	}
	env := got[0]
	var data questions.AnswerData
	if err := json.Unmarshal(env.Data, &data); err != nil {
		t.Fatal(err)
	}
	if env.ID != questions.QuestionEnvelopeID(qid) || env.Trust != subjects.TrustOperator || env.AgentID != agent ||
		env.Source != (subjects.Source{Type: "question", ID: qid}) || data.QuestionID != qid || len(data.Answers) != len(answers) {
		t.Fatalf("answer envelope: %+v", env)
	}
	for i, a := range answers {
		if data.Answers[i].Answer != a || !strings.Contains(env.Text, "Answer: "+a) {
			t.Errorf("answer %d: %+v, text %q, want %q", i+1, data.Answers[i], env.Text, a)
		}
	}
	return env
}

func TestQuestionsOverNATS(t *testing.T) {
	_, nc := startChime(t)
	ctx := context.Background()
	agent, _ := client.New(nc, "asker")
	live := inboxOf(t, nc, "asker")
	ask, err := agent.Ask(ctx, questions.QuestionItem{Title: "Deploy to prod?", Options: []string{"yes", "no"}},
		questions.QuestionItem{Title: "Anything else?"})
	if err != nil || !ask.Accepted || !strings.HasPrefix(ask.QuestionID, "q_") {
		t.Fatalf("ask: %+v %v", ask, err)
	}
	other, err := agent.Ask(ctx, questions.QuestionItem{Title: "Later?"})
	if err != nil {
		t.Fatal(err)
	}
	list, err := agent.ListQuestions(ctx, false)
	if err != nil || len(list) != 2 || list[0].ID != ask.QuestionID || list[1].ID != other.QuestionID ||
		list[0].Status != questions.QuestionOpen || list[0].Questions[0].Options[1] != "no" || list[0].AgentID != "asker" {
		t.Fatalf("list: %+v %v", list, err)
	}

	// The operator answers, over NATS.
	rep, err := agent.Answer(ctx, ask.QuestionID, "yes", "ship the docs too")
	if err != nil || !rep.OK || rep.Question.Status != questions.QuestionAnswered || rep.Question.DeliveredAt == nil {
		t.Fatalf("answer: %+v %v", rep, err)
	}
	if env := next(t, live); env.Kind != subjects.KindAnswer || env.Source.ID != ask.QuestionID {
		t.Fatalf("live delivery: %+v", env)
	}
	env := oneAnswer(t, nc, "asker", ask.QuestionID, "yes", "ship the docs too")
	if want := "The operator answered your question " + ask.QuestionID + ":\n1. Deploy to prod?\n   Answer: yes\n2. Anything else?\n   Answer: ship the docs too"; env.Text != want {
		t.Errorf("text %q", env.Text)
	}

	// Answered: out of the open list, in the full one.
	if list, _ := agent.ListQuestions(ctx, false); len(list) != 1 || list[0].ID != other.QuestionID {
		t.Errorf("open after the answer: %+v", list)
	}
	// In the order of last change: the answered one after the other.
	if list, _ := agent.ListQuestions(ctx, true); len(list) != 2 || list[1].Status != questions.QuestionAnswered || list[1].Answers[0] != "yes" {
		t.Errorf("all after the answer: %+v", list)
	}

	// A second answer, even the same one, is refused and delivers nothing.
	for _, again := range [][]string{{"no", "x"}, {"yes", "ship the docs too"}} {
		_, err := agent.Answer(ctx, ask.QuestionID, again...)
		if !errors.Is(err, subjects.ErrConflict) || err.Error() != "conflict: question "+ask.QuestionID+" is already answered" {
			t.Errorf("second answer %q: %v", again, err)
		}
	}
	oneAnswer(t, nc, "asker", ask.QuestionID, "yes", "ship the docs too")

	// Answers that do not fit the question, and unknown questions.
	for _, tc := range []struct {
		qid     string
		answers []string
		code    string
		msg     string
	}{
		{other.QuestionID, []string{"a", "b"}, subjects.CodeInvalidRequest, "question " + other.QuestionID + " has 1 titles: give 1 answers, in order, not 2"},
		{"q_nope", []string{"a"}, questions.CodeQuestionNotFound, "question q_nope not found"},
	} {
		_, err := agent.Answer(ctx, tc.qid, tc.answers...)
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code != tc.code || e.Message != tc.msg {
			t.Errorf("%s %q: %v, want %s: %s", tc.qid, tc.answers, err, tc.code, tc.msg)
		}
	}
	if _, err := agent.Answer(ctx, ask.QuestionID, "maybe", "x"); !errors.Is(err, subjects.ErrConflict) {
		t.Errorf("an answer to an answered question is a conflict before its options are checked: %v", err)
	}
	// Another agent's question is not found.
	stranger, _ := client.New(nc, "stranger")
	if _, err := stranger.Answer(ctx, other.QuestionID, "a"); !errors.Is(err, questions.ErrQuestionNotFound) {
		t.Errorf("another agent's question: %v", err)
	}
	if got := answersIn(t, nc, "asker", other.QuestionID); len(got) != 0 {
		t.Errorf("refused answers delivered: %+v", got)
	}
}

func TestQuestionsOverHTTP(t *testing.T) {
	r, nc := startChime(t)
	base := "http://" + r.HTTPAddr()
	ctx := context.Background()
	agent, _ := client.New(nc, "web")
	ask, err := agent.Ask(ctx, questions.QuestionItem{Title: "Which region?", Options: []string{"eu", "us"}})
	if err != nil {
		t.Fatal(err)
	}
	two, err := agent.Ask(ctx, questions.QuestionItem{Title: "A?"}, questions.QuestionItem{Title: "B?"})
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, []byte) {
		res, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, b
	}
	status, body := get("/api/agents/web/questions")
	var list questions.ListQuestionsReply
	if status != 200 || json.Unmarshal(body, &list) != nil || len(list.Questions) != 2 || list.Questions[0].ID != ask.QuestionID {
		t.Fatalf("list: %d %s", status, body)
	}
	answer := func(qid, body string) (int, []byte) {
		return postJSON(t, base, "/api/control/agents/web/questions/"+qid+"/answer", body)
	}
	for _, tc := range []struct {
		qid, body string
		status    int
		code, msg string
	}{
		{ask.QuestionID, `{"answer":"asia"}`, 400, subjects.CodeInvalidRequest, `answer 1 must be one of the options: "eu", "us"`},
		{two.QuestionID, `{"answer":"a"}`, 400, subjects.CodeInvalidRequest, "question " + two.QuestionID + " has 2 titles: give 2 answers, in order, not 1"},
		{ask.QuestionID, ``, 400, subjects.CodeInvalidRequest, "answers must not be empty"},
		{ask.QuestionID, `{"question_id":"q_x","answer":"eu"}`, 400, subjects.CodeInvalidJSON, `duplicate key "question_id"`},
		{ask.QuestionID, `{"answers":"eu"}`, 400, subjects.CodeInvalidRequest, "answers must be a JSON array, not string"},
		{"q_nope", `{"answer":"eu"}`, 404, questions.CodeQuestionNotFound, "question q_nope not found"},
		{"bad.id", `{"answer":"eu"}`, 400, subjects.CodeInvalidID, `question_id "bad.id" may only contain letters, digits, '_' and '-'`},
	} {
		status, body := answer(tc.qid, tc.body)
		if status != tc.status {
			t.Errorf("%s %s: status %d, want %d (%s)", tc.qid, tc.body, status, tc.status, body)
		}
		assertError(t, tc.qid+" "+tc.body, body, tc.code, tc.msg)
	}
	if got := answersIn(t, nc, "web", ask.QuestionID); len(got) != 0 {
		t.Fatalf("refused answers delivered: %+v", got)
	}

	status, body = answer(ask.QuestionID, `{"answer":" eu "}`)
	var rep questions.AnswerReply
	if status != 200 || json.Unmarshal(body, &rep) != nil || !rep.OK || rep.Question.Answers[0] != "eu" {
		t.Fatalf("answer: %d %s", status, body)
	}
	oneAnswer(t, nc, "web", ask.QuestionID, "eu")
	if status, body := answer(two.QuestionID, `{"answers":["first","second"]}`); status != 200 {
		t.Fatalf("answers: %d %s", status, body)
	}
	oneAnswer(t, nc, "web", two.QuestionID, "first", "second")
	status, body = answer(ask.QuestionID, `{"answer":"us"}`)
	if status != 409 {
		t.Errorf("second answer: %d %s", status, body)
	}
	assertError(t, "second answer", body, subjects.CodeConflict, "question "+ask.QuestionID+" is already answered")
	oneAnswer(t, nc, "web", ask.QuestionID, "eu")

	if status, body := get("/api/agents/web/questions"); status != 200 || string(body) != `{"questions":[],"next_cursor":""}` {
		t.Errorf("open list after the answers: %d %s", status, body)
	}
	status, body = get("/api/agents/web/questions?all=true")
	if status != 200 || json.Unmarshal(body, &list) != nil || len(list.Questions) != 2 || list.Questions[1].Answers[1] != "second" {
		t.Errorf("all: %d %s", status, body)
	}
	status, body = get("/api/agents/web/questions?all=yes")
	if status != 400 {
		t.Errorf("all=yes: %d", status)
	}
	assertError(t, "all=yes", body, subjects.CodeInvalidRequest, "all must be a JSON boolean, not string")
}

// TestQuestionConcurrentAnswers: ten operators answer at once, each
// differently: one wins, the others are refused, one envelope is stored,
// and it carries the winner's answer.
func TestQuestionConcurrentAnswers(t *testing.T) {
	_, nc := startChime(t)
	ctx := context.Background()
	agent, _ := client.New(nc, "busy")
	ask, err := agent.Ask(ctx, questions.QuestionItem{Title: "Who?"})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		winners []string
		wg      sync.WaitGroup
	)
	for i := range 10 {
		wg.Go(func() {
			op, _ := client.New(nc, "busy")
			a := fmt.Sprintf("operator %d", i)
			_, err := op.Answer(ctx, ask.QuestionID, a)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				winners = append(winners, a)
			case !errors.Is(err, subjects.ErrConflict):
				t.Errorf("%s: %v", a, err)
			}
		})
	}
	wg.Wait()
	if len(winners) != 1 {
		t.Fatalf("winners %q, want one", winners)
	}
	oneAnswer(t, nc, "busy", ask.QuestionID, winners[0])
}

// TestQuestionBadInput: each bad ask is refused with its text, and nothing
// is stored.
func TestQuestionBadInput(t *testing.T) {
	_, nc := startChime(t)
	for _, tc := range []struct{ body, code, msg string }{
		{`{}`, subjects.CodeInvalidRequest, "questions must not be empty"},
		{`{"questions":[]}`, subjects.CodeInvalidRequest, "questions must not be empty"},
		{`{"questions":[{"title":"  "}]}`, subjects.CodeInvalidRequest, "question titles must not be empty"},
		{`{"questions":[{"title":"t","options":["", " "]}]}`, subjects.CodeInvalidRequest, "options must contain at least one non-empty answer"},
		{`{"questions":[{"title":"t","Title":"u"}]}`, subjects.CodeInvalidRequest, `unknown field "Title" in questions.0`},
		{`{"questions":[{"title":"t"}],"questions":[]}`, subjects.CodeInvalidJSON, `duplicate key "questions"`},
		{"{\"questions\":[{\"title\":\"\xff\"}]}", subjects.CodeInvalidJSON, "invalid UTF-8: byte 0xff at offset 24"},
	} {
		msg := request(t, nc, subjects.Agent("bad", questions.ActionQuestionAsk), tc.body)
		assertError(t, tc.body, msg.Data, tc.code, tc.msg)
	}
	msg := request(t, nc, subjects.Agent("bad", questions.ActionQuestionAnswer), `{"question_id":"q_1","answer":"a","answers":["a"]}`)
	assertError(t, "answer and answers", msg.Data, subjects.CodeInvalidRequest, "use either answer or answers, not both")
	if n := storedKeys(t, nc, engine.QuestionsBucket, "bad"); n != 0 {
		t.Errorf("%d questions stored from bad input", n)
	}
}

// TestQuestionOwedDelivery: an answer recorded whose delivery never
// happened (a crash between the two) is delivered, once, by a retry of the
// same answer, by the agent's next listing, or by a replica's start sweep;
// another answer meanwhile is refused but delivers the owed one.
func TestQuestionOwedDelivery(t *testing.T) {
	_, nc := startChime(t)
	ctx := context.Background()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, engine.QuestionsBucket)
	if err != nil {
		t.Fatal(err)
	}
	// The first half of an answer, as a replica that then crashed left it.
	store := questions.NewStore(kv, nil, kvrec.Retention{})
	agent, _ := client.New(nc, "owed")
	owe := func(answer string) string {
		t.Helper()
		ask, err := agent.Ask(ctx, questions.QuestionItem{Title: "Go?"})
		if err != nil {
			t.Fatal(err)
		}
		if q, mine, err := store.Answer(ctx, "owed", ask.QuestionID, []string{answer}); err != nil || !mine || !q.Pending() {
			t.Fatalf("record the answer: %+v %v %v", q, mine, err)
		}
		if got := answersIn(t, nc, "owed", ask.QuestionID); len(got) != 0 {
			t.Fatalf("delivered already: %+v", got)
		}
		return ask.QuestionID
	}

	retried := owe("yes")
	if rep, err := agent.Answer(ctx, retried, "yes"); err != nil || rep.Question.DeliveredAt == nil {
		t.Fatalf("retry of the same answer: %+v %v", rep, err)
	}
	oneAnswer(t, nc, "owed", retried, "yes")

	other := owe("yes")
	if _, err := agent.Answer(ctx, other, "no"); !errors.Is(err, subjects.ErrConflict) {
		t.Fatalf("another answer: %v", err)
	}
	oneAnswer(t, nc, "owed", other, "yes")

	listed := owe("later")
	if _, err := agent.ListQuestions(ctx, false); err != nil {
		t.Fatal(err)
	}
	oneAnswer(t, nc, "owed", listed, "later")

	swept := owe("at start")
	svc := questions.NewService(store, consumer.NewInbox(js, engine.InboxStream, 10*time.Minute, nil), nil)
	if _, err := svc.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	oneAnswer(t, nc, "owed", swept, "at start")
	if q, err := store.Get(ctx, "owed", swept); err != nil || q.Pending() {
		t.Errorf("after the sweep: %+v %v", q, err)
	}
	// Nothing delivers twice.
	if _, err := svc.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if all, _ := agent.ListQuestions(ctx, true); len(all) != 4 {
		t.Errorf("all: %+v", all)
	}
	for _, qid := range []string{retried, other, listed, swept} {
		if n := len(answersIn(t, nc, "owed", qid)); n != 1 {
			t.Errorf("%s: %d envelopes", qid, n)
		}
	}
}

// TestAskRequestIDAndBound: an ask with a request_id, retried (in another
// spacing), answers the same question and asks nothing new; the same
// request_id with other questions is a conflict (409); the agent's open
// questions are bounded (CHIME_MAX_OPEN_QUESTIONS_PER_AGENT), a retry of
// an ask already stored is still answered at the bound, an answer makes
// room, and other agents are not touched.
func TestAskRequestIDAndBound(t *testing.T) {
	_, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.MaxOpenQuestions = 2 })
	ask := `{"questions":[{"title":"Deploy?","options":["yes","no"]}],"request_id":"ask-1"}`
	first := request(t, nc, "agent.asker.question.ask", ask)
	var reply questions.AskReply
	if err := json.Unmarshal(first.Data, &reply); err != nil || !reply.Accepted || reply.QuestionID != subjects.QuestionIDFor("asker", "ask-1") {
		t.Fatalf("first ask: %s", first.Data)
	}
	again := request(t, nc, "agent.asker.question.ask", `{ "request_id":"ask-1", "questions":[{"title":" Deploy? ","options":["yes","no",""]}] }`)
	if string(again.Data) != string(first.Data) {
		t.Fatalf("retry: %s, want %s", again.Data, first.Data)
	}
	msg := request(t, nc, "agent.asker.question.ask", `{"questions":[{"title":"Deploy?"}],"request_id":"ask-1"}`)
	assertError(t, "another ask under ask-1", msg.Data, "conflict", `request_id "ask-1" was used for a different request`)
	if msg.Header.Get("Nats-Service-Error-Code") != "409" {
		t.Errorf("conflict: headers %v", msg.Header)
	}
	request(t, nc, "agent.asker.question.ask", `{"questions":[{"title":"Second?"}]}`)
	const full = "agent asker has 2 open questions; at most 2 are allowed (CHIME_MAX_OPEN_QUESTIONS_PER_AGENT)"
	msg = request(t, nc, "agent.asker.question.ask", `{"questions":[{"title":"Third?"}]}`)
	assertError(t, "a third open question", msg.Data, "quota_exceeded", full)
	if msg.Header.Get("Nats-Service-Error-Code") != "429" {
		t.Errorf("bound: headers %v", msg.Header)
	}
	if again := request(t, nc, "agent.asker.question.ask", ask); string(again.Data) != string(first.Data) {
		t.Fatalf("a retry at the bound: %s", again.Data)
	}
	c, _ := client.New(nc, "asker")
	ctx := context.Background()
	if r, err := c.AskOnce(ctx, "ask-1", questions.QuestionItem{Title: "Deploy?", Options: []string{"yes", "no"}}); err != nil || r.QuestionID != reply.QuestionID {
		t.Fatalf("the client's retry: %+v %v", r, err)
	}
	if _, err := c.AskOnce(ctx, "ask-1", questions.QuestionItem{Title: "Other?"}); !errors.Is(err, subjects.ErrConflict) {
		t.Fatalf("the client's conflict: %v", err)
	}
	open := func() int {
		var list questions.ListQuestionsReply
		if err := c.Request(ctx, questions.ActionQuestionList, nil, &list); err != nil {
			t.Fatal(err)
		}
		return len(list.Questions)
	}
	if n := open(); n != 2 {
		t.Fatalf("%d open questions, want 2", n)
	}
	other := request(t, nc, "agent.other-asker.question.ask", `{"questions":[{"title":"Mine?"}]}`)
	if err := json.Unmarshal(other.Data, &reply); err != nil || !reply.Accepted {
		t.Fatalf("another agent: %s", other.Data)
	}
	answer := fmt.Sprintf(`{"question_id":%q,"answer":"yes"}`, subjects.QuestionIDFor("asker", "ask-1"))
	if msg := request(t, nc, "agent.asker.question.answer", answer); msg.Header.Get("Nats-Service-Error") != "" {
		t.Fatalf("answer: %s", msg.Data)
	}
	if msg := request(t, nc, "agent.asker.question.ask", `{"questions":[{"title":"Third?"}]}`); msg.Header.Get("Nats-Service-Error") != "" {
		t.Fatalf("after an answer: %s", msg.Data)
	}
	if n := open(); n != 2 {
		t.Fatalf("%d open questions, want 2", n)
	}
}
