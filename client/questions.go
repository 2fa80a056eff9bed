package client

import (
	"context"

	"github.com/chime-nats/chime/subjects"
)

// Ask asks the operator questions and returns at once: the answer arrives
// in the inbox later, as an envelope of kind answer whose source ID is the
// returned question ID. An item with Options asks the operator to choose
// one of them.
func (c *Client) Ask(ctx context.Context, questions ...subjects.QuestionItem) (*subjects.AskReply, error) {
	var r subjects.AskReply
	return &r, c.call(ctx, subjects.ActionQuestionAsk, subjects.AskRequest{Questions: questions}, &r)
}

// AskOnce is Ask made repeatable by requestID: a retry with the same
// requestID (after a timeout or an `unavailable`, say) returns the
// question the first attempt made instead of asking again, for as long as
// it is kept; the same requestID with other questions is an error
// matching subjects.ErrConflict.
func (c *Client) AskOnce(ctx context.Context, requestID string, questions ...subjects.QuestionItem) (*subjects.AskReply, error) {
	var r subjects.AskReply
	return &r, c.call(ctx, subjects.ActionQuestionAsk, subjects.AskRequest{Questions: questions, RequestID: &requestID}, &r)
}

// ListQuestions lists the agent's open questions, oldest first; with all,
// the answered ones still kept too.
func (c *Client) ListQuestions(ctx context.Context, all bool) ([]subjects.Question, error) {
	var r subjects.ListQuestionsReply
	return r.Questions, c.call(ctx, subjects.ActionQuestionList, subjects.ListQuestionsRequest{All: all}, &r)
}

// Answer answers one of the agent's questions (an operator's request):
// one answer per question title, in order. It returns once the answer is
// in the agent's inbox; a question already answered is an error matching
// subjects.ErrConflict, an unknown one subjects.ErrQuestionNotFound.
func (c *Client) Answer(ctx context.Context, questionID string, answers ...string) (*subjects.AnswerReply, error) {
	var r subjects.AnswerReply
	return &r, c.call(ctx, subjects.ActionQuestionAnswer, subjects.AnswerRequest{QuestionID: questionID, Answers: answers}, &r)
}
