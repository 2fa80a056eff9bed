package questions_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chime-nats/chime/questions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/subjects/subjectstest"
)

func TestDecodeAsk(t *testing.T) {
	for _, tc := range []struct {
		body string
		want []questions.QuestionItem
	}{
		{`{"questions":[{"title":"Deploy now?"}]}`, []questions.QuestionItem{{Title: "Deploy now?"}}},
		{`{"questions":[{"title":" Region? ","options":["eu"," us ",""]},{"title":"Why?","options":null}]}`,
			[]questions.QuestionItem{{Title: "Region?", Options: []string{"eu", "us"}}, {Title: "Why?"}}},
	} {
		got, err := questions.DecodeAsk([]byte(tc.body))
		if err != nil || !reflect.DeepEqual(got.Items, tc.want) || got.Request != (subjects.RequestKey{}) {
			t.Errorf("%s: got %+v, %v; want %+v", tc.body, got, err, tc.want)
		}
	}
}

// TestDecodeAskRequestID: a request_id is keyed with the questions as
// trimmed; another request_id or other questions is another key.
func TestDecodeAskRequestID(t *testing.T) {
	key := func(body string) subjects.RequestKey {
		t.Helper()
		spec, err := questions.DecodeAsk([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return spec.Request
	}
	a := key(`{"questions":[{"title":"Deploy?","options":["yes","no"]}],"request_id":"r1"}`)
	if a.RequestID != "r1" || len(a.RequestHash) != 32 {
		t.Fatalf("key %+v", a)
	}
	if b := key(`{"request_id":"r1","questions":[{"title":" Deploy? ","options":["yes","no",""]}]}`); b != a {
		t.Errorf("the same ask spaced otherwise: %+v, want %+v", b, a)
	}
	if c := key(`{"questions":[{"title":"Deploy?","options":["yes"]}],"request_id":"r1"}`); c.RequestHash == a.RequestHash {
		t.Error("another ask under the same request_id has the same hash")
	}
}

func TestDecodeAskErrors(t *testing.T) {
	for _, tc := range []struct{ body, code, msg string }{
		{``, subjects.CodeInvalidRequest, "questions must not be empty"},
		{`{"questions":[]}`, subjects.CodeInvalidRequest, "questions must not be empty"},
		{`{"questions":null}`, subjects.CodeInvalidRequest, "questions must not be empty"},
		{`{"questions":[{"title":""}]}`, subjects.CodeInvalidRequest, "question titles must not be empty"},
		{`{"questions":[{"title":"ok"},{"title":" \t"}]}`, subjects.CodeInvalidRequest, "question titles must not be empty"},
		{`{"questions":[{"options":["a"]}]}`, subjects.CodeInvalidRequest, "question titles must not be empty"},
		{`{"questions":[{"title":"t","options":[]}]}`, subjects.CodeInvalidRequest, "options must contain at least one non-empty answer"},
		{`{"questions":[{"title":"t","options":[""," "]}]}`, subjects.CodeInvalidRequest, "options must contain at least one non-empty answer"},
		{`{"questions":[{"title":"t","Options":["a"]}]}`, subjects.CodeInvalidRequest, `unknown field "Options" in questions.0`},
		{`{"questions":[{"title":"t"}],"request_id":""}`, subjects.CodeInvalidRequest, "request_id must not be empty"},
		{`{"questions":[{"title":"t"}],"request_id":5}`, subjects.CodeInvalidRequest, "request_id must be a JSON string, not number"},
		{`{"questions":[{"title":"t"}],"request_ids":"r"}`, subjects.CodeInvalidRequest, `unknown field "request_ids"`},
		{`{"questions":[{"title":5}]}`, subjects.CodeInvalidRequest, "questions.0.title must be a JSON string, not number"},
		{`{"questions":[{"title":"a","title":"b"}]}`, subjects.CodeInvalidJSON, `duplicate key "title" in questions.0`},
		{`[]`, subjects.CodeInvalidJSON, "request body must be a JSON object"},
	} {
		_, err := questions.DecodeAsk([]byte(tc.body))
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code != tc.code || e.Message != tc.msg {
			t.Errorf("%s: got %v, want %s: %s", tc.body, err, tc.code, tc.msg)
		}
	}
}

func TestDecodeAnswer(t *testing.T) {
	for _, tc := range []struct {
		body    string
		answers []string
	}{
		{`{"question_id":"q_1","answers":["yes"," eu "]}`, []string{"yes", "eu"}},
		{`{"question_id":"q_1","answer":" yes"}`, []string{"yes"}},
		{`{"question_id":"q_1","answer":"yes","answers":null}`, []string{"yes"}},
	} {
		id, got, err := questions.DecodeAnswer([]byte(tc.body))
		if err != nil || id != "q_1" || !slices.Equal(got, tc.answers) {
			t.Errorf("%s: got %q %q, %v", tc.body, id, got, err)
		}
	}
	for _, tc := range []struct{ body, code, msg string }{
		{`{"answers":["a"]}`, subjects.CodeInvalidID, "question_id must not be empty"},
		{`{"question_id":"q.1","answers":["a"]}`, subjects.CodeInvalidID, `question_id "q.1" may only contain letters, digits, '_' and '-'`},
		{`{"question_id":"q_1"}`, subjects.CodeInvalidRequest, "answers must not be empty"},
		{`{"question_id":"q_1","answers":[]}`, subjects.CodeInvalidRequest, "answers must not be empty"},
		{`{"question_id":"q_1","answer":"a","answers":["a"]}`, subjects.CodeInvalidRequest, "use either answer or answers, not both"},
		{`{"question_id":"q_1","answers":["a"," "]}`, subjects.CodeInvalidRequest, "answers must not be empty strings"},
		{`{"question_id":"q_1","answer":""}`, subjects.CodeInvalidRequest, "answers must not be empty strings"},
		{`{"question_id":"q_1","answers":"a"}`, subjects.CodeInvalidRequest, "answers must be a JSON array, not string"},
		{`{"question_id":"q_1","answers":["a"],"extra":1}`, subjects.CodeInvalidRequest, `unknown field "extra"`},
	} {
		_, _, err := questions.DecodeAnswer([]byte(tc.body))
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code != tc.code || e.Message != tc.msg {
			t.Errorf("%s: got %v, want %s: %s", tc.body, err, tc.code, tc.msg)
		}
	}
}

func TestDecodeListQuestions(t *testing.T) {
	if all, page, err := questions.DecodeListQuestions(nil); err != nil || all || page.Limit != subjects.DefaultListLimit || page.From != nil {
		t.Errorf("empty body: %v %+v %v", all, page, err)
	}
	if all, page, err := questions.DecodeListQuestions([]byte(`{"all":true,"limit":3}`)); err != nil || !all || page.Limit != 3 {
		t.Errorf("all: %v %+v %v", all, page, err)
	}
	cursor := subjects.EncodeCursor(questions.ActionQuestionList, subjects.CursorPos{Buckets: 1, Seq: 9})
	if _, page, err := questions.DecodeListQuestions([]byte(`{"cursor":"` + cursor + `"}`)); err != nil || len(page.From) != 1 || page.From[0].Seq != 9 {
		t.Errorf("cursor: %+v %v", page, err)
	}
	if _, _, err := questions.DecodeListQuestions([]byte(`{"all":"yes"}`)); err == nil || err.Error() != "invalid_request: all must be a JSON boolean, not string" {
		t.Errorf("all as a string: %v", err)
	}
}

func TestCheckAnswers(t *testing.T) {
	q := &questions.Question{ID: "q_1", Questions: []questions.QuestionItem{{Title: "Deploy?", Options: []string{"yes", "no"}}, {Title: "Why?"}}}
	if err := q.CheckAnswers([]string{"yes", "because"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		answers []string
		msg     string
	}{
		{[]string{"yes"}, "question q_1 has 2 titles: give 2 answers, in order, not 1"},
		{[]string{"yes", "a", "b"}, "question q_1 has 2 titles: give 2 answers, in order, not 3"},
		{[]string{"Yes", "because"}, `answer 1 must be one of the options: "yes", "no"`},
	} {
		err := q.CheckAnswers(tc.answers)
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code != subjects.CodeInvalidRequest || e.Message != tc.msg {
			t.Errorf("%q: got %v, want %s", tc.answers, err, tc.msg)
		}
	}
}

func TestAnswerEnvelope(t *testing.T) {
	asked := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	answered := asked.Add(time.Minute)
	q := &questions.Question{ID: "q_1", AgentID: "a1", Status: questions.QuestionAnswered, CreatedAt: asked, AnsweredAt: &answered,
		Questions: []questions.QuestionItem{{Title: "Deploy?", Options: []string{"yes", "no"}}, {Title: "Why?"}}, Answers: []string{"yes", "green CI"}}
	env := questions.AnswerEnvelope(q)
	if env.ID != "question_q_1_answer" || env.Kind != subjects.KindAnswer || env.Trust != subjects.TrustOperator || !env.At.Equal(answered) ||
		env.Source != (subjects.Source{Type: "question", ID: "q_1"}) || env.AgentID != "a1" {
		t.Fatalf("envelope: %+v", env)
	}
	if want := "The operator answered your question q_1:\n1. Deploy?\n   Answer: yes\n2. Why?\n   Answer: green CI"; env.Text != want {
		t.Errorf("text %q, want %q", env.Text, want)
	}
	var data questions.AnswerData
	if err := json.Unmarshal(env.Data, &data); err != nil || data.QuestionID != "q_1" || !data.AskedAt.Equal(asked) ||
		!reflect.DeepEqual(data.Answers, []questions.AnsweredItem{{Title: "Deploy?", Options: []string{"yes", "no"}, Answer: "yes"}, {Title: "Why?", Answer: "green CI"}}) {
		t.Errorf("data: %s (%v)", env.Data, err)
	}
	if again := questions.AnswerEnvelope(q); !reflect.DeepEqual(again, env) {
		t.Error("the envelope of one record differs between attempts")
	}
}

func TestWithQuestionID(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{``, `{"question_id":"q_1"}`},
		{` {} `, `{"question_id":"q_1"} `},
		{`{"answer":"a"}`, `{"question_id":"q_1","answer":"a"}`},
		{"\n{ \"answers\":[\"a\"]}", `{"question_id":"q_1", "answers":["a"]}`},
		{`["a"]`, `["a"]`},
	} {
		if got := string(questions.WithQuestionID([]byte(tc.body), "q_1")); got != tc.want {
			t.Errorf("%q: got %q, want %q", tc.body, got, tc.want)
		}
	}
	if _, _, err := questions.DecodeAnswer(questions.WithQuestionID([]byte(`{"question_id":"q_2","answer":"a"}`), "q_1")); err == nil ||
		!strings.Contains(err.Error(), `duplicate key "question_id"`) {
		t.Errorf("a body naming another question: %v", err)
	}
	if _, _, err := questions.DecodeAnswer(questions.WithQuestionID([]byte(`{"answer":"a"}`), `x","answer":"b`)); !errors.Is(err, subjects.ErrInvalidID) {
		t.Errorf("a path ID with quotes: %v", err)
	}
}

func FuzzDecodeAsk(f *testing.F) {
	subjectstest.AddSeeds(f, `{"questions":[{"title":"t"}]}`, `{"questions":[{"title":" t ","options":["a",""," "]}]}`,
		`{"questions":[{"title":"t","options":[]}]}`, `{"questions":[{"title":"t","options":null}]}`)
	subjectstest.Request(f, questions.DecodeAsk, []string{"questions", "request_id"}, subjectstest.DecodeCodes, func(t *testing.T, body []byte, spec *questions.AskSpec) {
		items := spec.Items
		if len(items) == 0 {
			t.Fatalf("accepted %s with no questions", body)
		}
		for _, q := range items {
			if q.Title == "" || q.Title != strings.TrimSpace(q.Title) || (q.Options != nil && len(q.Options) == 0) ||
				slices.ContainsFunc(q.Options, func(o string) bool { return o == "" || o != strings.TrimSpace(o) }) {
				t.Fatalf("accepted %s as %+v", body, items)
			}
		}
		if back, err := questions.DecodeAsk(subjectstest.EncodeBody(t, questions.AskRequest{Questions: items})); err != nil || !reflect.DeepEqual(back.Items, items) {
			t.Fatalf("%s accepted as %+v, which reads back as %+v (%v)", body, items, back, err)
		}
	})
}

type decodedAnswer struct {
	id      string
	answers []string
}

func FuzzDecodeAnswer(f *testing.F) {
	subjectstest.AddSeeds(f, `{"question_id":"q_1","answers":["a"]}`, `{"question_id":"q_1","answer":" a "}`,
		`{"question_id":"q_1","answer":"a","answers":[]}`, `{"question_id":"q.1","answers":[""]}`)
	decode := func(b []byte) (decodedAnswer, error) {
		id, answers, err := questions.DecodeAnswer(b)
		return decodedAnswer{id, answers}, err
	}
	keys := []string{"question_id", "answers", "answer"}
	subjectstest.Request(f, decode, keys, []string{subjects.CodeInvalidJSON, subjects.CodeInvalidRequest, subjects.CodeInvalidID}, func(t *testing.T, body []byte, v decodedAnswer) {
		if subjects.ValidateID("question_id", v.id) != nil || len(v.answers) == 0 ||
			slices.ContainsFunc(v.answers, func(a string) bool { return a == "" || a != strings.TrimSpace(a) }) {
			t.Fatalf("accepted %s as %+v", body, v)
		}
		back, err := decode(subjectstest.EncodeBody(t, questions.AnswerRequest{QuestionID: v.id, Answers: v.answers}))
		if err != nil || back.id != v.id || !slices.Equal(back.answers, v.answers) {
			t.Fatalf("%s accepted as %+v, which reads back as %+v (%v)", body, v, back, err)
		}
	})
}
