// Package questions owns questions an agent asks its operator without
// stopping its turn (Codex's request_user_input_async): the question
// records in the questions KV bucket, their one answer each, and that
// answer's one delivery to the agent's inbox, as kind answer.
//
// An answer is first written into the record by CAS (open -> answered),
// which is what makes it the only one; its envelope, whose ID and bytes
// depend on the record alone, is then stored through consumer.Inbox; last
// the record is marked delivered. A crash or an outage between the CAS
// and the delivery leaves an answered record still owing it (Pending):
// the caller's retry of the same answer, the agent's next listing, and
// every replica's start deliver it, and the envelope ID keeps it single
// whoever gets there, however many at once.
package questions

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/subjects"
)

// Store reads and writes question records.
type Store struct {
	kv        jetstream.KeyValue
	now       func() time.Time
	retention kvrec.Retention
}

// NewStore returns a Store over the questions bucket. Answered questions
// whose answer is delivered are removed after retention.
func NewStore(kv jetstream.KeyValue, now func() time.Time, retention kvrec.Retention) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{kv: kv, now: now, retention: retention}
}

// Create stores a new open question of the agent. An ask with a
// request_id makes the question whose ID derives from it: a retry of that
// ask, on any replica, finds and returns that question as it is now, and
// the same request_id with another ask is a conflict (as timer.create).
func (s *Store) Create(ctx context.Context, agentID string, spec *AskSpec) (*Question, error) {
	q := &Question{
		ID: NewQuestionID(), AgentID: agentID, Status: QuestionOpen,
		CreatedAt: s.now().UTC(), Questions: spec.Items, RequestKey: spec.Request,
	}
	if spec.Request.RequestID != "" {
		q.ID = subjects.QuestionIDFor(agentID, spec.Request.RequestID)
	}
	// The ID is fixed before the first attempt: the key is taken only by
	// this call's own earlier attempt, whose reply was lost, or by the
	// first attempt of the same ask.
	mine := func(stored *Question) bool {
		return stored.CreatedAt.Equal(q.CreatedAt) || q.Replays(stored.RequestKey)
	}
	stored, _, err := kvrec.Create(ctx, s.kv, q.Key(), q, mine)
	if errors.Is(err, jetstream.ErrKeyExists) && q.RequestID != "" {
		return nil, q.Conflict()
	}
	if err != nil {
		return nil, fmt.Errorf("questions: create: %w", err)
	}
	return stored, nil
}

// Open counts the agent's open questions.
func (s *Store) Open(ctx context.Context, agentID string) (int, error) {
	list, err := s.List(ctx, agentID)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, q := range list {
		if q.Status == QuestionOpen {
			n++
		}
	}
	return n, nil
}

// Get returns one of the agent's questions.
func (s *Store) Get(ctx context.Context, agentID, questionID string) (*Question, error) {
	q, _, err := kvrec.Get[Question](ctx, s.kv, QuestionKey(agentID, questionID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, QuestionNotFound(questionID)
	}
	if err != nil {
		return nil, fmt.Errorf("questions: get: %w", err)
	}
	return q, nil
}

// List returns the agent's questions, oldest first.
func (s *Store) List(ctx context.Context, agentID string) ([]Question, error) {
	return s.list(ctx, agentID+".*")
}

// Page returns a page of the agent's questions, as timers.Store.List does
// for timers; with open, only the open ones, reading at most
// kvrec.MaxScan questions (the page may then hold fewer than limit, or
// none, and go on).
func (s *Store) Page(ctx context.Context, agentID string, limit int, from subjects.CursorPos, open bool) ([]Question, subjects.CursorPos, error) {
	var keep func(*Question) bool
	if open {
		keep = func(q *Question) bool { return q.Status == QuestionOpen || q.Pending() }
	}
	pg, err := kvrec.ListPage(ctx, s.retention.JS, []string{s.kv.Bucket()}, agentID+".*", kvrec.Pos(from), limit, keep)
	if errors.Is(err, kvrec.ErrPos) {
		return nil, subjects.CursorPos{}, subjects.ErrCursorStale()
	}
	if err != nil {
		return nil, subjects.CursorPos{}, fmt.Errorf("questions: list: %w", err)
	}
	return pg.Items, subjects.CursorPos(pg.Next), nil
}

func (s *Store) list(ctx context.Context, filter string) ([]Question, error) {
	out, err := kvrec.List[Question](ctx, s.kv, filter)
	if err != nil {
		return nil, fmt.Errorf("questions: list: %w", err)
	}
	slices.SortFunc(out, func(a, b Question) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

// update changes one question by CAS; see kvrec.Update. A delivered
// answer's write carries the retention TTL.
func (s *Store) update(ctx context.Context, agentID, questionID string, change func(*Question) (bool, error)) (*Question, bool, error) {
	q, changed, err := kvrec.Update(ctx, s.kv, QuestionKey(agentID, questionID), false, change,
		kvrec.ExpireFinished(s.retention, (*Question).Finished))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, false, QuestionNotFound(questionID)
	}
	if err != nil {
		return nil, false, err
	}
	return q, changed, nil
}

// Answer records answers to an open question. mine reports whether the
// record now holds these very answers: answered by this call, or by an
// earlier attempt of the same answer (a retry). Answers that do not fit
// the question are refused before anything is written.
func (s *Store) Answer(ctx context.Context, agentID, questionID string, answers []string) (q *Question, mine bool, err error) {
	q, changed, err := s.update(ctx, agentID, questionID, func(q *Question) (bool, error) {
		if q.Status != QuestionOpen {
			return false, nil
		}
		if err := q.CheckAnswers(answers); err != nil {
			return false, err
		}
		at := s.now().UTC()
		q.Status, q.Answers, q.AnsweredAt = QuestionAnswered, answers, &at
		return true, nil
	})
	if err != nil {
		return nil, false, err
	}
	return q, changed || slices.Equal(q.Answers, answers), nil
}

// Delivered marks an answered question's envelope as stored; it then
// expires after the retention.
func (s *Store) Delivered(ctx context.Context, agentID, questionID string) (*Question, error) {
	q, _, err := s.update(ctx, agentID, questionID, func(q *Question) (bool, error) {
		if !q.Pending() {
			return false, nil
		}
		at := s.now().UTC()
		q.DeliveredAt = &at
		return true, nil
	})
	return q, err
}

// Sweep gives the delivered answers stored before records expired their
// TTL one (see kvrec.Sweep).
func (s *Store) Sweep(ctx context.Context) (int, error) {
	return kvrec.Sweep(ctx, s.retention, s.kv, (*Question).Finished, s.now())
}

// Service serves the question requests: asks, listings and answers with
// their delivery.
type Service struct {
	store *Store
	inbox *consumer.Inbox
	log   *slog.Logger
}

// NewService returns the question requests over store; answers are
// delivered through inbox.
func NewService(store *Store, inbox *consumer.Inbox, log *slog.Logger) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{store: store, inbox: inbox, log: log.With("component", "questions")}
}

// Ask stores the agent's question and returns at once: the answer comes
// to the inbox whenever an operator gives it. A retry of an ask with a
// request_id answers the question it made (see Store.Create).
func (s *Service) Ask(ctx context.Context, agentID string, spec *AskSpec) (*AskReply, error) {
	q, err := s.store.Create(ctx, agentID, spec)
	if err != nil {
		return nil, err
	}
	return &AskReply{Accepted: true, QuestionID: q.ID}, nil
}

// Get returns one of the agent's questions.
func (s *Service) Get(ctx context.Context, agentID, questionID string) (*Question, error) {
	return s.store.Get(ctx, agentID, questionID)
}

// Open counts the agent's open questions, for the bound on them. It lags
// asks still on their way (here or on another replica): concurrent asks
// may overshoot the bound by what is in flight.
func (s *Service) Open(ctx context.Context, agentID string) (int, error) {
	return s.store.Open(ctx, agentID)
}

// List returns a page of the agent's open questions (all: answered ones
// too), in the order of each one's last change (oldest first: an open
// question has not changed since it was asked). Answers on the page still
// owing their delivery are delivered first.
func (s *Service) List(ctx context.Context, agentID string, all bool, page subjects.ListPage) (*ListQuestionsReply, error) {
	list, next, err := s.store.Page(ctx, agentID, page.Limit, page.Walk(0), !all)
	if err != nil {
		return nil, err
	}
	out := []Question{}
	for _, q := range list {
		if q.Pending() {
			if done, err := s.deliver(ctx, &q); err != nil {
				s.log.Warn("answer delivery still owed", "agent_id", agentID, "question_id", q.ID, "err", err)
			} else {
				q = *done
			}
		}
		if all || q.Status == QuestionOpen {
			out = append(out, q)
		}
	}
	return &ListQuestionsReply{Questions: out, NextCursor: subjects.EncodeCursor(ActionQuestionList, next)}, nil
}

// Answer answers the agent's question and returns once the answer is in
// the inbox. A second answer is refused (conflict); a retry of the answer
// that made it (the same answers) completes its delivery and succeeds.
func (s *Service) Answer(ctx context.Context, agentID, questionID string, answers []string) (*AnswerReply, error) {
	q, err := s.store.Get(ctx, agentID, questionID)
	if err != nil {
		return nil, err
	}
	if q.Status == QuestionOpen {
		if err := q.CheckAnswers(answers); err != nil {
			return nil, err
		}
		// Refused before it is stored: an answer whose delivery can never
		// fit an inbox message could only be given up later.
		if err := s.fits(q, answers); err != nil {
			return nil, err
		}
	}
	q, mine, err := s.store.Answer(ctx, agentID, questionID, answers)
	if err != nil {
		return nil, err
	}
	if !mine || !q.Pending() {
		if q.Pending() {
			// Someone else's answer, still owed to the inbox: deliver it
			// now rather than leave it to a later listing.
			if _, err := s.deliver(ctx, q); err != nil {
				s.log.Warn("answer delivery still owed", "agent_id", agentID, "question_id", questionID, "err", err)
			}
		}
		return nil, AlreadyAnswered(questionID)
	}
	if q, err = s.deliver(ctx, q); err != nil {
		// The answer is stored, its delivery is not yet: the caller's
		// retry (or the next listing, or a replica's start) delivers it.
		return nil, fmt.Errorf("questions: deliver the answer to %s: %w", questionID, err)
	}
	return &AnswerReply{OK: true, Question: q}, nil
}

// fits checks that q's answer delivery, with answers, fits an inbox
// message.
func (s *Service) fits(q *Question, answers []string) error {
	at := time.Date(2999, 12, 31, 23, 59, 59, 999999999, time.UTC) // the widest timestamp
	answered := *q
	answered.Status, answered.Answers, answered.AnsweredAt = QuestionAnswered, answers, &at
	env := AnswerEnvelope(&answered)
	m, err := env.Msg()
	if err != nil {
		return fmt.Errorf("questions: encode answer: %w", err)
	}
	if limit := s.inbox.Room(); int64(len(m.Data)) > limit {
		return &subjects.Error{Code: subjects.CodePayloadTooLarge, Message: fmt.Sprintf(
			"answer too large: its inbox delivery would be %d bytes, at most %d fit", len(m.Data), limit)}
	}
	return nil
}

// deliver stores an answered question's envelope, then marks the record
// delivered, and returns the record.
func (s *Service) deliver(ctx context.Context, q *Question) (*Question, error) {
	env := AnswerEnvelope(q)
	if _, err := s.inbox.DeliverOnce(ctx, &env, env.At); err != nil {
		return nil, err
	}
	return s.store.Delivered(ctx, q.AgentID, q.ID)
}

// Sweep runs at a replica's start: it gives the delivered answers kept
// without a TTL one (returning how many), and delivers every answer still
// owed (a crash between an answer and its delivery with no retry since).
func (s *Service) Sweep(ctx context.Context) (int, error) {
	n, err := s.store.Sweep(ctx)
	if err != nil {
		return n, err
	}
	all, err := s.store.list(ctx, ">")
	if err != nil {
		return n, err
	}
	var errs []error
	delivered := 0
	for _, q := range all {
		if !q.Pending() {
			continue
		}
		if _, err := s.deliver(ctx, &q); err != nil {
			errs = append(errs, fmt.Errorf("questions: deliver the answer to %s: %w", q.ID, err))
			continue
		}
		delivered++
	}
	if delivered > 0 {
		s.log.Info("owed answers delivered", "answers", delivered)
	}
	return n, errors.Join(errs...)
}
