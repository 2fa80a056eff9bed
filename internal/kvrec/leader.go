package kvrec

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Last is the last message of a bucket whose key matches a filter.
type Last struct {
	Seq  uint64 // its revision
	Data []byte
}

// LeaderLast reads the last message of bucket whose key matches filter (a
// key, or a pattern such as "idx.>") from the bucket stream's leader. A KV
// get may be answered by a follower that lags a write acknowledged
// elsewhere; the stream's message API is answered by the leader, so what
// it returns is at least as new as every acknowledged write. No message:
// jetstream.ErrKeyNotFound. (chime uses no JetStream domain or API prefix.)
func LeaderLast(ctx context.Context, nc *nats.Conn, bucket, filter string) (*Last, error) {
	return leaderLast(ctx, nc, "KV_"+bucket, "$KV."+bucket+"."+filter)
}

// leaderLast reads the last message of stream on subject (or matching a
// subject pattern) from the stream's leader; see LeaderLast.
func leaderLast(ctx context.Context, nc *nats.Conn, stream, subject string) (*Last, error) {
	req, _ := json.Marshal(map[string]string{"last_by_subj": subject})
	msg, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, fmt.Errorf("last of %s: %w: %w", subject, ErrUnavailable, err)
	}
	var res struct {
		Message *struct {
			Seq  uint64 `json:"seq"`
			Data []byte `json:"data"`
		} `json:"message"`
		Error *struct {
			Code        int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &res); err != nil {
		return nil, fmt.Errorf("last of %s: %w", subject, err)
	}
	switch {
	case res.Error != nil && res.Error.Code == int(jetstream.JSErrCodeMessageNotFound):
		return nil, jetstream.ErrKeyNotFound
	case res.Error != nil:
		return nil, fmt.Errorf("last of %s: %w: %s", subject, ErrUnavailable, res.Error.Description)
	case res.Message == nil:
		return nil, fmt.Errorf("last of %s: no message in the answer", subject)
	}
	return &Last{Seq: res.Message.Seq, Data: res.Message.Data}, nil
}

// WithLeader gives kv a way to read its stream's leader, through nc: an
// UpdateRev that would end without writing (the key missing, or the change
// finding nothing to do) confirms what it read there first, and a List
// that its copy was current. A KV get may be answered by a follower that
// lags (a server back from a partition, still catching up), and a list's
// watch placed on one: a write decided on its answer meets a revision
// mismatch and reads again, but a decision to write nothing would stand on
// stale state: a wait fire finding no wait, or a wait not armed yet; an
// intervention cancelling the waits a stale list shows, not those made
// meanwhile.
func WithLeader(kv jetstream.KeyValue, nc *nats.Conn) jetstream.KeyValue {
	if kv == nil || nc == nil {
		return kv
	}
	return leaderKV{KeyValue: kv, nc: nc}
}

type leaderKV struct {
	jetstream.KeyValue
	nc *nats.Conn
}

// leaderGetter is a KeyValue that can read its leader (WithLeader).
type leaderGetter interface {
	leaderGet(ctx context.Context, key string) (data []byte, rev uint64, err error)
	leaderRev(ctx context.Context, filter string) (uint64, error)
	leadersLast(ctx context.Context, key string) (uint64, error)
}

// leadersWindow is how long after the first answer leadersLast waits for
// another: two servers that both believe they lead answer at once, each
// without a Raft round.
const leadersWindow = 20 * time.Millisecond

// leadersLast is key's last revision as the servers that believe they lead
// the bucket's stream hold it; see leadersLast.
func (l leaderKV) leadersLast(ctx context.Context, key string) (uint64, error) {
	return leadersLast(ctx, l.nc, "$KV."+l.Bucket()+"."+key)
}

// leadersLast is the last sequence on subject of the stream that stores
// it, as the servers that believe they lead that stream hold it: the
// highest they answer, 0 when none holds a message there. Right after a
// heal two servers can: the one back from the partition answers leader
// reads from its old store, and the JetStream API hands the client only
// the first answer. A CAS write is answered by each, to the client
// directly: this one expects a sequence no subject reaches, so each
// refuses it at once naming the last it holds ("wrong last sequence: N"),
// and nothing is ever stored.
func leadersLast(ctx context.Context, nc *nats.Conn, subject string) (uint64, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return 0, fmt.Errorf("last of %s on the leaders: %w", subject, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	m := nats.NewMsg(subject)
	m.Reply = inbox
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(math.MaxUint64, 10))
	if err := nc.PublishMsg(m); err != nil {
		return 0, fmt.Errorf("last of %s on the leaders: %w", subject, err)
	}
	var last uint64
	var refused bool
	var firstErr error
	wait := ctx
	for answers := 0; ; answers++ {
		msg, err := sub.NextMsgWithContext(wait)
		switch {
		case err != nil && answers == 0:
			return 0, fmt.Errorf("last of %s on the leaders: %w", subject, err)
		case err != nil && refused: // the window passed
			return last, nil
		case err != nil:
			return 0, fmt.Errorf("last of %s on the leaders: %w", subject, firstErr)
		}
		if answers == 0 {
			var cancel context.CancelFunc
			wait, cancel = context.WithTimeout(ctx, leadersWindow)
			defer cancel()
		}
		at, err := refusal(msg)
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		last, refused = max(last, at), true
	}
}

// refusal is the revision a CAS refusal names.
func refusal(msg *nats.Msg) (uint64, error) {
	if msg.Header.Get("Status") == "503" {
		return 0, nats.ErrNoResponders
	}
	var res struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &res); err != nil {
		return 0, err
	}
	if res.Error == nil {
		return 0, errors.New("a write expecting no sequence was stored")
	}
	if at, ok := refusedAt(res.Error); ok {
		return at, nil
	}
	return 0, res.Error // retried when Transient: a stream between leaders
}

// leaderGet reads key's last message from the leader: its record and
// revision; no data with the marker's revision when it was deleted or
// purged (a marker's data is empty; no record is); jetstream.ErrKeyNotFound
// when the leader holds no message for key at all.
func (l leaderKV) leaderGet(ctx context.Context, key string) ([]byte, uint64, error) {
	last, err := LeaderLast(ctx, l.nc, l.Bucket(), key)
	if err != nil {
		return nil, 0, err
	}
	if len(last.Data) == 0 {
		return nil, last.Seq, nil
	}
	return last.Data, last.Seq, nil
}

// leaderRev is the last revision of the keys matching filter on the
// leader, deletions included; 0 when there is none.
func (l leaderKV) leaderRev(ctx context.Context, filter string) (uint64, error) {
	return leaderLastSeq(ctx, l.nc, "KV_"+l.Bucket(), "$KV."+l.Bucket()+"."+filter)
}

// leaderLastSeq is the sequence of stream's last message on subject (or
// matching a pattern) on its leader; 0 when there is none.
func leaderLastSeq(ctx context.Context, nc *nats.Conn, stream, subject string) (uint64, error) {
	last, err := leaderLast(ctx, nc, stream, subject)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return last.Seq, nil
}
