package questions

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/chime-nats/chime/subjects"
	"github.com/nats-io/nuid"
)

// Question actions: an agent asks, an operator (or the agent) lists, an
// operator answers.
const (
	ActionQuestionAsk    = "question.ask"
	ActionQuestionList   = "question.list"
	ActionQuestionAnswer = "question.answer"
)

// CodeQuestionNotFound is a question the agent does not have (never asked,
// or answered longer ago than the record retention).
const CodeQuestionNotFound = "question_not_found"

// ErrQuestionNotFound matches (errors.Is) every question_not_found error.
var ErrQuestionNotFound = &subjects.Error{Code: CodeQuestionNotFound}

// NewQuestionID returns a fresh, subject-safe question ID.
func NewQuestionID() string { return "q_" + nuid.Next() }

// QuestionKey is the KV key of a question record: <agent>.<question>.
func QuestionKey(agentID, questionID string) string { return agentID + "." + questionID }

// QuestionEnvelopeID is the stable ID of a question's one answer delivery.
func QuestionEnvelopeID(questionID string) string { return "question_" + questionID + "_answer" }

// QuestionStatus is where a question is in its life.
type QuestionStatus string

// Question statuses.
const (
	QuestionOpen     QuestionStatus = "open"
	QuestionAnswered QuestionStatus = "answered"
)

// QuestionItem is one question of an ask: a title and, optionally, the
// answers the operator may choose from.
type QuestionItem struct {
	Title   string   `json:"title"`
	Options []string `json:"options,omitempty"`
}

// Question is the record of one ask, key <agent>.<question_id> in the
// questions bucket. It is answered once: Answers holds one answer per
// item of Questions, in order. DeliveredAt is set once the answer
// envelope is stored in the inbox; an answered record without it still
// owes its delivery.
type Question struct {
	ID          string         `json:"id"`
	AgentID     string         `json:"agent_id"`
	Status      QuestionStatus `json:"status"`
	CreatedAt   time.Time      `json:"created_at"`
	Questions   []QuestionItem `json:"questions"`
	Answers     []string       `json:"answers,omitempty"`
	AnsweredAt  *time.Time     `json:"answered_at,omitempty"`
	DeliveredAt *time.Time     `json:"delivered_at,omitempty"`
	// RequestKey is set when the ask had a request_id.
	subjects.RequestKey
}

// Key is the record's KV key.
func (q *Question) Key() string { return QuestionKey(q.AgentID, q.ID) }

// Pending reports an answered question whose answer is not yet known to be
// in the inbox.
func (q *Question) Pending() bool { return q.Status == QuestionAnswered && q.DeliveredAt == nil }

// Finished reports a question whose answer is delivered: nothing more
// happens to it, so it may expire.
func (q *Question) Finished() bool { return q.Status == QuestionAnswered && q.DeliveredAt != nil }

// AskRequest is the body of agent.<id>.question.ask.
type AskRequest struct {
	Questions []QuestionItem `json:"questions"`
	// RequestID, when set, makes a retry of this ask return the question
	// it made instead of asking again.
	RequestID *string `json:"request_id"`
}

// AskSpec is a decoded ask.
type AskSpec struct {
	Items []QuestionItem
	// Request is set when the ask had a request_id.
	Request subjects.RequestKey
}

// AskReply answers an ask at once; the answer comes later, to the inbox.
type AskReply struct {
	Accepted   bool   `json:"accepted"`
	QuestionID string `json:"question_id"`
}

// DecodeAsk decodes and validates an ask. Titles and options are trimmed;
// blank options are dropped, but a list of options with none left is
// refused: the operator would have nothing to choose. A request_id is
// keyed with the questions as trimmed, so a retry spaced differently is
// the same ask.
func DecodeAsk(data []byte) (*AskSpec, error) {
	var r AskRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return nil, err
	}
	if r.RequestID != nil {
		if err := subjects.ValidateRequestID(*r.RequestID); err != nil {
			return nil, err
		}
	}
	if len(r.Questions) == 0 {
		return nil, subjects.Invalid("questions must not be empty")
	}
	out := make([]QuestionItem, len(r.Questions))
	for i, q := range r.Questions {
		out[i].Title = strings.TrimSpace(q.Title)
		if out[i].Title == "" {
			return nil, subjects.Invalid("question titles must not be empty")
		}
		if q.Options == nil { // absent or null: free text
			continue
		}
		out[i].Options = []string{}
		for _, o := range q.Options {
			if o = strings.TrimSpace(o); o != "" {
				out[i].Options = append(out[i].Options, o)
			}
		}
		if len(out[i].Options) == 0 {
			return nil, subjects.Invalid("options must contain at least one non-empty answer")
		}
	}
	key, err := subjects.NewRequestKey(r.RequestID, ActionQuestionAsk, out)
	if err != nil {
		return nil, err
	}
	return &AskSpec{Items: out, Request: key}, nil
}

// ListQuestionsRequest is the body of agent.<id>.question.list: a
// listing's and all.
type ListQuestionsRequest struct {
	// All includes answered questions (those still kept).
	All    bool            `json:"all,omitempty"`
	Limit  json.RawMessage `json:"limit,omitempty"`
	Cursor string          `json:"cursor,omitempty"`
}

// ListQuestionsReply is a page of questions, in the order of each one's
// last change, oldest first; NextCursor as for timers.
type ListQuestionsReply struct {
	Questions  []Question `json:"questions"`
	NextCursor string     `json:"next_cursor"`
}

// DecodeListQuestions decodes a list request; an empty body lists the
// first page of the open questions.
func DecodeListQuestions(data []byte) (all bool, page subjects.ListPage, err error) {
	var r ListQuestionsRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return false, subjects.ListPage{}, err
	}
	page, err = (&subjects.ListRequest{Limit: r.Limit, Cursor: r.Cursor}).Page(ActionQuestionList, 1)
	return r.All, page, err
}

// AnswerRequest is the body of agent.<id>.question.answer: answers, one
// per question title in order, or answer alone for a question with one
// title.
type AnswerRequest struct {
	QuestionID string   `json:"question_id"`
	Answers    []string `json:"answers,omitempty"`
	Answer     *string  `json:"answer,omitempty"`
}

// AnswerReply says the answer is stored and delivered.
type AnswerReply struct {
	OK       bool      `json:"ok"`
	Question *Question `json:"question"`
}

// DecodeAnswer decodes an answer: the question ID and the answers,
// trimmed. Whether they fit the question is the store's check.
func DecodeAnswer(data []byte) (questionID string, answers []string, err error) {
	var r AnswerRequest
	if err := subjects.DecodeStrict(data, &r); err != nil {
		return "", nil, err
	}
	if err := subjects.ValidateID("question_id", r.QuestionID); err != nil {
		return "", nil, err
	}
	switch {
	case r.Answer != nil && r.Answers != nil:
		return "", nil, subjects.Invalid("use either answer or answers, not both")
	case r.Answer != nil:
		answers = []string{*r.Answer}
	default:
		answers = r.Answers
	}
	if len(answers) == 0 {
		return "", nil, subjects.Invalid("answers must not be empty")
	}
	out := make([]string, len(answers))
	for i, a := range answers {
		if out[i] = strings.TrimSpace(a); out[i] == "" {
			return "", nil, subjects.Invalid("answers must not be empty strings")
		}
	}
	return r.QuestionID, out, nil
}

// CheckAnswers checks answers against the question: one per title, and one
// of the options where the question has them.
func (q *Question) CheckAnswers(answers []string) error {
	if len(answers) != len(q.Questions) {
		return subjects.Invalid(fmt.Sprintf("question %s has %d titles: give %d answers, in order, not %d",
			q.ID, len(q.Questions), len(q.Questions), len(answers)))
	}
	for i, item := range q.Questions {
		if item.Options != nil && !slices.Contains(item.Options, answers[i]) {
			quoted := make([]string, len(item.Options))
			for j, o := range item.Options {
				quoted[j] = strconv.Quote(o)
			}
			return subjects.Invalid(fmt.Sprintf("answer %d must be one of the options: %s", i+1, strings.Join(quoted, ", ")))
		}
	}
	return nil
}

// AlreadyAnswered is the error of an answer to an answered question.
func AlreadyAnswered(questionID string) error {
	return &subjects.Error{Code: subjects.CodeConflict, Message: fmt.Sprintf("question %s is already answered", questionID)}
}

// QuestionNotFound is the error of an answer to an unknown question.
func QuestionNotFound(questionID string) error {
	return &subjects.Error{Code: CodeQuestionNotFound, Message: fmt.Sprintf("question %s not found", questionID)}
}

// AnsweredItem is one question with its answer, in an answer delivery.
type AnsweredItem struct {
	Title   string   `json:"title"`
	Options []string `json:"options,omitempty"`
	Answer  string   `json:"answer"`
}

// AnswerData is the data of an answer delivery.
type AnswerData struct {
	QuestionID string         `json:"question_id"`
	Answers    []AnsweredItem `json:"answers"`
	AskedAt    time.Time      `json:"asked_at"`
}

// AnswerText renders an answered question for the agent:
//
//	The operator answered your question q_...:
//	1. <title>
//	   Answer: <answer>
func AnswerText(q *Question) string {
	var b strings.Builder
	fmt.Fprintf(&b, "The operator answered your question %s:", q.ID)
	for i, item := range q.Questions {
		answer := ""
		if i < len(q.Answers) {
			answer = q.Answers[i]
		}
		fmt.Fprintf(&b, "\n%d. %s\n   Answer: %s", i+1, item.Title, answer)
	}
	return b.String()
}

// AnswerEnvelope builds the one inbox delivery of an answered question.
// It depends on the record alone (at: when it was answered), so every
// attempt to deliver it, by any replica, builds the same envelope.
func AnswerEnvelope(q *Question) subjects.Envelope {
	items := make([]AnsweredItem, len(q.Questions))
	for i, item := range q.Questions {
		items[i] = AnsweredItem{Title: item.Title, Options: item.Options}
		if i < len(q.Answers) {
			items[i].Answer = q.Answers[i]
		}
	}
	data, _ := subjects.EncodeJSON(AnswerData{QuestionID: q.ID, Answers: items, AskedAt: q.CreatedAt})
	at := q.CreatedAt
	if q.AnsweredAt != nil {
		at = *q.AnsweredAt
	}
	return subjects.Envelope{
		ID: QuestionEnvelopeID(q.ID), AgentID: q.AgentID, Kind: subjects.KindAnswer, At: at.UTC(),
		Source: subjects.Source{Type: "question", ID: q.ID}, Trust: subjects.TrustOperator, Text: AnswerText(q), Data: data,
	}
}

// WithQuestionID adds question_id to an HTTP answer body, whose question
// is named by the route's path (see WithField).
func WithQuestionID(body []byte, questionID string) []byte {
	return subjects.WithField(body, "question_id", questionID)
}
