package directget_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/directget"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
)

// setup starts an embedded JetStream server with a stream S on s.> that
// answers direct gets, holding s.a.<i> (i 0..9) interleaved with s.b.<i>
// at sequences 1..20, then s.a.0 again (21): s.a.<i> is at 2i+1, s.b.<i>
// at 2i+2.
func setup(t *testing.T) (jetstream.JetStream, context.Context) {
	t.Helper()
	js := natstest.JetStream(t, natstest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		for _, k := range []string{"a", "b"} {
			if _, err := js.Publish(ctx, fmt.Sprintf("s.%s.%d", k, i), fmt.Appendf(nil, "%s%d", k, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := js.Publish(ctx, "s.a.0", []byte("a0 again")); err != nil {
		t.Fatal(err)
	}
	return js, ctx
}

// each runs test with a reader of S that subscribes per batch and one
// whose batches share a subscription.
func each(t *testing.T, test func(t *testing.T, js jetstream.JetStream, ctx context.Context, st *directget.Stream)) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			js, ctx := setup(t)
			var opts []directget.Option
			if shared {
				opts = append(opts, directget.WithReplies(directget.NewReplies(js.Conn())))
			}
			test(t, js, ctx, directget.New(js, "S", opts...))
		})
	}
}

func seqs(a *directget.Answer) []uint64 {
	out := []uint64{}
	for _, m := range a.Msgs {
		out = append(out, m.Seq)
	}
	return out
}

// TestRequests: each kind of request, and the answers that end it: one
// message, or a batch and its end (204) with the count of what follows.
func TestRequests(t *testing.T) {
	each(t, func(t *testing.T, js jetstream.JetStream, ctx context.Context, st *directget.Stream) {
		for _, tc := range []struct {
			name    string
			req     directget.Request
			seqs    []uint64
			pending uint64
		}{
			{"by sequence", directget.Request{Seq: 4}, []uint64{4}, 0},
			{"last for a subject", directget.Request{LastFor: "s.a.0"}, []uint64{21}, 0},
			{"next for a filter", directget.Request{Seq: 4, NextFor: "s.a.*"}, []uint64{5}, 0},
			{"a batch", directget.Request{Seq: 4, NextFor: "s.a.*", Batch: 3}, []uint64{5, 7, 9}, 6 /* 11 13 ... 21 */},
			{"a batch to the end", directget.Request{Seq: 14, NextFor: "s.a.*", Batch: 100}, []uint64{15, 17, 19, 21}, 0},
			{"a batch bounded in bytes", directget.Request{Seq: 1, NextFor: "s.b.*", Batch: 100, MaxBytes: 1}, []uint64{2}, 9},
			{"multi-last", directget.Request{MultiLast: []string{"s.a.*"}}, []uint64{3, 5, 7, 9, 11, 13, 15, 17, 19, 21}, 0},
			{"multi-last from a sequence up to one, in a batch", directget.Request{Seq: 4, MultiLast: []string{"s.a.*"}, UpToSeq: 12, Batch: 2}, []uint64{5, 7}, 2},
		} {
			t.Run(tc.name, func(t *testing.T) {
				a, err := st.Get(ctx, tc.req)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(seqs(a), tc.seqs) || a.Pending != tc.pending {
					t.Fatalf("got %v pending %d, want %v pending %d", seqs(a), a.Pending, tc.seqs, tc.pending)
				}
				for _, m := range a.Msgs {
					want, err := js.Conn().Request("$JS.API.DIRECT.GET.S", fmt.Appendf(nil, `{"seq":%d}`, m.Seq), 5*time.Second)
					if err != nil {
						t.Fatal(err)
					}
					if m.Subject != want.Header.Get(jetstream.SubjectHeader) || string(m.Data) != string(want.Data) {
						t.Fatalf("message %d: %s %q, stored %s %q", m.Seq, m.Subject, m.Data, want.Header.Get(jetstream.SubjectHeader), want.Data)
					}
					if at, err := m.Time(); err != nil || time.Since(at) > time.Minute {
						t.Fatalf("message %d stored at %v %v", m.Seq, at, err)
					}
				}
			})
		}
	})
}

// TestStatusAnswers: nothing found (404) is an empty answer, for one
// message or a batch; the server's refusals are errors callers can tell
// apart: a bad request (408), too many subjects for a multi-last get
// (413), a stream that does not answer direct gets (503).
func TestStatusAnswers(t *testing.T) {
	each(t, func(t *testing.T, js jetstream.JetStream, ctx context.Context, st *directget.Stream) {
		for _, req := range []directget.Request{
			{Seq: 1000},
			{LastFor: "s.c"},
			{Seq: 1, NextFor: "s.c.*"},
			{Seq: 1, NextFor: "s.c.*", Batch: 10},
			{Seq: 22, NextFor: "s.a.*", Batch: 10},
			{MultiLast: []string{"s.c.*"}, Batch: 10},
		} {
			a, err := st.Get(ctx, req)
			if err != nil || a.Pending != 0 || len(a.Msgs) != 0 {
				t.Fatalf("%+v: %v %v, want nothing", req, a, err)
			}
		}

		for _, req := range []directget.Request{
			{},                         // nothing asked
			{Seq: 1, LastFor: "s.a.0"}, // two ways at once
			{LastFor: "s.a.0", MultiLast: []string{"s.a.*"}}, // batch
		} {
			if _, err := st.Get(ctx, req); !errors.Is(err, directget.ErrBadRequest) {
				t.Fatalf("%+v: %v, want ErrBadRequest", req, err)
			}
		}

		for i := range directget.MaxMultiLast {
			if _, err := js.Publish(ctx, fmt.Sprintf("s.many.%d", i), nil); err != nil {
				t.Fatal(err)
			}
		}
		if a, err := st.Get(ctx, directget.Request{MultiLast: []string{"s.many.*"}}); err != nil || len(a.Msgs) != directget.MaxMultiLast {
			t.Fatalf("multi-last of %d subjects: %v", directget.MaxMultiLast, err)
		}
		if _, err := js.Publish(ctx, "s.many.x", nil); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Get(ctx, directget.Request{MultiLast: []string{"s.many.*"}}); !errors.Is(err, directget.ErrTooMany) {
			t.Fatalf("multi-last of one subject more: %v, want ErrTooMany", err)
		}

		cfg := jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, AllowDirect: false}
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		for _, req := range []directget.Request{{Seq: 1}, {Seq: 1, NextFor: "s.a.*", Batch: 10}} {
			_, err := st.Get(ctx, req)
			if !errors.Is(err, directget.ErrNoDirect) || !errors.Is(err, nats.ErrNoResponders) || !kvrec.Transient(err) {
				t.Fatalf("%+v without direct gets: %v, want ErrNoDirect, transient", req, err)
			}
		}
	})
}

// TestStoredStatusShapedMessages: a message anyone stored with a Status
// header and no body (as a pull's status reply aimed into a KV bucket
// is) is read as the message it is, alone or in a batch, not taken for
// the server's answer (which made every read of the bucket fail).
func TestStoredStatusShapedMessages(t *testing.T) {
	each(t, func(t *testing.T, js jetstream.JetStream, ctx context.Context, st *directget.Stream) {
		// Not 503: nats.go itself reads a bodiless message with that
		// status as "no responders" before chime sees it.
		for _, status := range []string{"404", "204", "408", "409"} {
			m := &nats.Msg{Subject: "s.planted." + status, Header: nats.Header{"Status": []string{status}, "Description": []string{"planted"}}}
			if _, err := js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
		a, err := st.Get(ctx, directget.Request{LastFor: "s.planted.404"})
		if err != nil || len(a.Msgs) != 1 || a.Msgs[0].Subject != "s.planted.404" {
			t.Fatalf("last for a planted 404: %+v %v, want the message", a, err)
		}
		a, err = st.Get(ctx, directget.Request{Seq: 1, NextFor: "s.planted.*", Batch: 10})
		if err != nil || !slices.Equal(seqs(a), []uint64{22, 23, 24, 25}) {
			t.Fatalf("a batch of planted statuses: %v %v, want 22..25", a, err)
		}
		a, err = st.Get(ctx, directget.Request{MultiLast: []string{"s.planted.*"}})
		if err != nil || len(a.Msgs) != 4 {
			t.Fatalf("multi-last of planted statuses: %v %v, want 4", a, err)
		}
	})
}

// TestRetry: a stream's reads are retried as its Retry says: one that
// finds no responder until the stream answers direct gets gets its answer
// then.
func TestRetry(t *testing.T) {
	js, ctx := setup(t)
	if _, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	attempts := 0
	retried := directget.New(js, "S", directget.WithRetry(func(ctx context.Context, attempt func(context.Context) (*directget.Answer, error)) (*directget.Answer, error) {
		return kvrec.Retried(ctx, func(ctx context.Context) (*directget.Answer, error) {
			if attempts++; attempts == 3 {
				if _, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, AllowDirect: true}); err != nil {
					return nil, err
				}
			}
			return attempt(ctx)
		})
	}))
	a, err := retried.Get(ctx, directget.Request{Seq: 1, NextFor: "s.a.*", Batch: 2})
	if err != nil || !slices.Equal(seqs(a), []uint64{1, 3}) || attempts != 3 {
		t.Fatalf("got %v %v after %d attempts, want [1 3] after 3", a, err, attempts)
	}
}

// TestWalk reads every message matching a filter in batches, each from
// after the last one read, until none is left; fn's error ends it.
func TestWalk(t *testing.T) {
	each(t, func(t *testing.T, js jetstream.JetStream, ctx context.Context, st *directget.Stream) {
		var got []string
		err := st.Walk(ctx, directget.Request{NextFor: "s.a.*", Batch: 3}, func(m *directget.Msg) error {
			got = append(got, fmt.Sprint(m.Seq, " ", string(m.Data)))
			return nil
		})
		want := []string{"1 a0", "3 a1", "5 a2", "7 a3", "9 a4", "11 a5", "13 a6", "15 a7", "17 a8", "19 a9", "21 a0 again"}
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("walk: %v %q, want %q", err, got, want)
		}

		stop := errors.New("enough")
		n := 0
		err = st.Walk(ctx, directget.Request{Seq: 5, NextFor: "s.>", Batch: 2}, func(m *directget.Msg) error {
			if n++; n == 3 {
				return stop
			}
			return nil
		})
		if !errors.Is(err, stop) || n != 3 {
			t.Fatalf("a walk fn stopped: %v after %d", err, n)
		}
		if err := st.Walk(ctx, directget.Request{Seq: 1, NextFor: "s.a.*"}, func(*directget.Msg) error { return nil }); !errors.Is(err, directget.ErrBadRequest) {
			t.Fatalf("a walk of single gets: %v", err)
		}
	})
}

// TestSharedReplies: many batches in flight on one connection, their
// replies through one subscription, each get only their own; the
// subscription is made once.
func TestSharedReplies(t *testing.T) {
	js, ctx := setup(t)
	st := directget.New(js, "S", directget.WithReplies(directget.NewReplies(js.Conn())))
	subs := js.Conn().NumSubscriptions()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			k, n := []string{"a", "b"}[i%2], i%10
			a, err := st.Get(ctx, directget.Request{Seq: 1, NextFor: fmt.Sprintf("s.%s.%d", k, n), Batch: 5})
			switch {
			case err != nil:
				errs <- err
			case len(a.Msgs) == 0 || string(a.Msgs[0].Data) != fmt.Sprint(k, n):
				errs <- fmt.Errorf("s.%s.%d: got %v", k, n, a.Msgs)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := js.Conn().NumSubscriptions() - subs; got != 1 {
		t.Fatalf("%d subscriptions made for 64 batches, want 1", got)
	}
}

// TestAPIPrefix: a stream reached through a JetStream API prefix (an
// imported API) is read under it, with or without its final dot.
func TestAPIPrefix(t *testing.T) {
	js, ctx := setup(t)
	for _, prefix := range []string{"$JS.API", "$JS.API."} {
		pjs, err := jetstream.NewWithAPIPrefix(js.Conn(), prefix)
		if err != nil {
			t.Fatal(err)
		}
		a, err := directget.New(pjs, "S").Get(ctx, directget.Request{LastFor: "s.b.9"})
		if err != nil || !slices.Equal(seqs(a), []uint64{20}) {
			t.Fatalf("prefix %q: %v %v", prefix, a, err)
		}
	}
	// A domain the server does not have: the request goes under it, and
	// nothing answers there.
	djs, err := jetstream.NewWithDomain(js.Conn(), "elsewhere")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := directget.New(djs, "S").Get(ctx, directget.Request{Seq: 1}); !errors.Is(err, directget.ErrNoDirect) {
		t.Fatalf("an unknown domain: %v", err)
	}
}
