package questions_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/questions"
	"github.com/chime-nats/chime/subjects"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ttlOf is the Nats-TTL header of the record's current revision.
func ttlOf(t *testing.T, js jetstream.JetStream, key string) string {
	t.Helper()
	s, err := js.Stream(context.Background(), "KV_"+engine.QuestionsBucket)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(context.Background(), "$KV."+engine.QuestionsBucket+"."+key)
	if err != nil {
		t.Fatal(err)
	}
	return m.Header.Get(jetstream.MsgTTLHeader)
}

// TestAnswerLifecycle: open and answered-but-undelivered records never
// expire; the write that marks the answer delivered carries the retention.
// An answer that does not fit is refused and changes nothing.
func TestAnswerLifecycle(t *testing.T) {
	ns := natstest.Server(t)
	nc, res := natstest.Provisioned(t, ns)
	ctx := context.Background()
	js, _ := jetstream.New(nc)
	now := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	store := questions.NewStore(res.Questions, clock, kvrec.Retention{JS: js, After: time.Hour, Markers: time.Minute})
	svc := questions.NewService(store, consumer.NewInbox(js, engine.InboxStream, 10*time.Minute, clock), nil)

	ask, err := svc.Ask(ctx, "a1", &questions.AskSpec{Items: []questions.QuestionItem{{Title: "Go?", Options: []string{"yes", "no"}}}})
	if err != nil || !ask.Accepted {
		t.Fatalf("ask: %+v %v", ask, err)
	}
	key := questions.QuestionKey("a1", ask.QuestionID)
	if _, err := svc.Answer(ctx, "a1", ask.QuestionID, []string{"maybe"}); !errors.Is(err, subjects.ErrInvalidRequest) {
		t.Fatalf("an answer outside the options: %v", err)
	}
	if _, mine, err := store.Answer(ctx, "a1", ask.QuestionID, []string{"maybe"}); !errors.Is(err, subjects.ErrInvalidRequest) || mine {
		t.Fatalf("the store takes an answer outside the options: %v", err)
	}
	if q, _ := store.Get(ctx, "a1", ask.QuestionID); q.Status != questions.QuestionOpen || ttlOf(t, js, key) != "" {
		t.Fatalf("open: %+v, ttl %q", q, ttlOf(t, js, key))
	}
	q, mine, err := store.Answer(ctx, "a1", ask.QuestionID, []string{"yes"})
	if err != nil || !mine || !q.Pending() || !q.AnsweredAt.Equal(now) || ttlOf(t, js, key) != "" {
		t.Fatalf("answered, not delivered: %+v %v %v, ttl %q", q, mine, err, ttlOf(t, js, key))
	}
	if _, mine, _ := store.Answer(ctx, "a1", ask.QuestionID, []string{"no"}); mine {
		t.Fatal("another answer counts as this one")
	}
	rep, err := svc.Answer(ctx, "a1", ask.QuestionID, []string{"yes"})
	if err != nil || !rep.Question.Finished() || ttlOf(t, js, key) != "1h0m0s" {
		t.Fatalf("delivered: %+v %v, ttl %q", rep, err, ttlOf(t, js, key))
	}
	if _, err := svc.Answer(ctx, "a1", ask.QuestionID, []string{"yes"}); !errors.Is(err, subjects.ErrConflict) {
		t.Fatalf("after delivery: %v", err)
	}
	if _, err := svc.Answer(ctx, "a1", "q_nope", []string{"yes"}); !errors.Is(err, questions.ErrQuestionNotFound) {
		t.Fatalf("unknown: %v", err)
	}
}
