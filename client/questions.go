package client

import (
	"context"
	"encoding/json"
	"strconv"

	"github.com/chime-nats/chime/questions"
	"github.com/chime-nats/chime/subjects"
)

// Ask asks the operator questions and returns at once: the answer arrives
// in the inbox later, as an envelope of kind answer whose source ID is the
// returned question ID. An item with Options asks the operator to choose
// one of them.
func (c *Client) Ask(ctx context.Context, items ...questions.QuestionItem) (*questions.AskReply, error) {
	var r questions.AskReply
	return &r, c.call(ctx, questions.ActionQuestionAsk, questions.AskRequest{Questions: items}, &r)
}

// AskOnce is Ask made repeatable by requestID: a retry with the same
// requestID (after a timeout or an `unavailable`, say) returns the
// question the first attempt made instead of asking again, for as long as
// it is kept; the same requestID with other questions is an error
// matching subjects.ErrConflict.
func (c *Client) AskOnce(ctx context.Context, requestID string, items ...questions.QuestionItem) (*questions.AskReply, error) {
	var r questions.AskReply
	return &r, c.call(ctx, questions.ActionQuestionAsk, questions.AskRequest{Questions: items, RequestID: &requestID}, &r)
}

// ListQuestions lists the agent's open questions, oldest first; with
// withAnswered, the answered ones still kept too. It reads every page
// (QuestionsPage), as the listing did before it had pages.
func (c *Client) ListQuestions(ctx context.Context, withAnswered bool) ([]questions.Question, error) {
	return all(ctx, func(ctx context.Context, cursor string) ([]questions.Question, string, error) {
		r, err := c.QuestionsPage(ctx, withAnswered, subjects.MaxListLimit, cursor)
		if err != nil {
			return nil, "", err
		}
		return r.Questions, r.NextCursor, nil
	}, func(q *questions.Question) string { return q.ID })
}

// QuestionsPage returns a page of the agent's open questions (with
// withAnswered, answered ones too), as TimersPage does. A page of open
// questions may hold fewer than limit, even none, and still have a
// NextCursor: it read past answered ones.
func (c *Client) QuestionsPage(ctx context.Context, withAnswered bool, limit int, cursor string) (*questions.ListQuestionsReply, error) {
	req := questions.ListQuestionsRequest{All: withAnswered, Cursor: cursor}
	if limit > 0 {
		req.Limit = json.RawMessage(strconv.Itoa(limit))
	}
	var r questions.ListQuestionsReply
	return &r, c.call(ctx, questions.ActionQuestionList, req, &r)
}

// Answer answers one of the agent's questions (an operator's request):
// one answer per question title, in order. It returns once the answer is
// in the agent's inbox; a question already answered is an error matching
// subjects.ErrConflict, an unknown one subjects.ErrQuestionNotFound.
func (c *Client) Answer(ctx context.Context, questionID string, answers ...string) (*questions.AnswerReply, error) {
	var r questions.AnswerReply
	return &r, c.call(ctx, questions.ActionQuestionAnswer, questions.AnswerRequest{QuestionID: questionID, Answers: answers}, &r)
}
