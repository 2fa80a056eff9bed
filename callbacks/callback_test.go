package callbacks_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/subjects/subjectstest"
)

func TestDecodeCallbackBody(t *testing.T) {
	for _, tc := range []struct {
		name, contentType, body string
		want                    callbacks.Payload
		reason, text            string
	}{
		{"empty", "", "", callbacks.Payload{}, "external trigger fired", ""},
		{"blank JSON", "application/json", "  \n", callbacks.Payload{}, "external trigger fired", ""},
		{"text", "text/plain; charset=utf-8", "build 7 green", callbacks.Payload{Text: "build 7 green"}, "build 7 green", "build 7 green"},
		{"JSON text field", "application/json", `{ "text" : "hi" }`, callbacks.Payload{JSON: []byte(`{"text":"hi"}`)}, `{"text":"hi"}`, "hi"},
		{"JSON other", "application/json", `{"ok": true}`, callbacks.Payload{JSON: []byte(`{"ok":true}`)}, `{"ok":true}`, `{"ok":true}`},
		{"+json", "application/vnd.github+json", `[1, 2]`, callbacks.Payload{JSON: []byte(`[1,2]`)}, `[1,2]`, `[1,2]`},
		{"untyped JSON", "", `{"a":1}`, callbacks.Payload{JSON: []byte(`{"a":1}`)}, `{"a":1}`, `{"a":1}`},
		{"untyped bytes", "", "not json", callbacks.Payload{ContentType: "application/octet-stream", BodyBase64: "bm90IGpzb24="}, "external trigger fired", ""},
		{"binary", "image/png", "\x89PNG", callbacks.Payload{ContentType: "image/png", BodyBase64: "iVBORw=="}, "external trigger fired", ""},
		{"text not UTF-8", "text/plain", "\xff\xfe", callbacks.Payload{ContentType: "text/plain", BodyBase64: "//4="}, "external trigger fired", ""},
		{"bad content type", "text/", "x", callbacks.Payload{ContentType: "application/octet-stream", BodyBase64: "eA=="}, "external trigger fired", ""},
	} {
		got, err := callbacks.DecodeCallbackBody(tc.contentType, []byte(tc.body))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !reflect.DeepEqual(*got, tc.want) {
			t.Errorf("%s: got %+v, want %+v", tc.name, *got, tc.want)
		}
		if r := got.WakeReason(); r != tc.reason {
			t.Errorf("%s: reason %q, want %q", tc.name, r, tc.reason)
		}
		if m := got.MessageText(); m != tc.text {
			t.Errorf("%s: text %q, want %q", tc.name, m, tc.text)
		}
	}
}

func TestDecodeCallbackBodyErrors(t *testing.T) {
	for _, tc := range []struct{ contentType, body, code string }{
		{"application/json", `{"text":`, subjects.CodeInvalidJSON},
		{"application/problem+json", `{]`, subjects.CodeInvalidJSON},
		{"text/plain", strings.Repeat("a", callbacks.MaxCallbackBody+1), subjects.CodePayloadTooLarge},
	} {
		_, err := callbacks.DecodeCallbackBody(tc.contentType, []byte(tc.body))
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code != tc.code {
			t.Errorf("%s %.20q: %v, want %s", tc.contentType, tc.body, err, tc.code)
		}
	}
	if _, err := callbacks.DecodeCallbackBody("text/plain", bytes.Repeat([]byte("a"), callbacks.MaxCallbackBody)); err != nil {
		t.Errorf("256 KiB: %v", err)
	}
}

func TestWakeReasonCut(t *testing.T) {
	p := callbacks.Payload{JSON: []byte(`"` + strings.Repeat("é", 200) + `"`)}
	if got := p.WakeReason(); got != `"`+strings.Repeat("é", 159)+"..." {
		t.Errorf("JSON cut by characters: %q", got)
	}
	p = callbacks.Payload{JSON: []byte(strings.Repeat("1", 160))}
	if got := p.WakeReason(); got != string(p.JSON) {
		t.Errorf("160 characters are not cut: %q", got)
	}
	p = callbacks.Payload{Text: strings.Repeat("x", 500)}
	if got := p.WakeReason(); got != p.Text {
		t.Errorf("a text reason is the text, uncut: %d characters", len(got))
	}
}

func TestCallbackEnvelopeSize(t *testing.T) {
	body := strings.Repeat("<&>", 60000) // HTML escaping would make this 1 MB
	p, err := callbacks.DecodeCallbackBody("text/plain", []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	env := callbacks.CallbackEnvelope(&callbacks.CallbackEvent{ID: "x", AgentID: "a", TriggerID: "t", Mode: callbacks.ModeEnqueueMessage, Payload: p})
	m, err := env.Msg()
	if err != nil || len(m.Data) > len(body)+400 || env.Text != body {
		t.Errorf("envelope of %d bytes for a %d-byte text (%v)", len(m.Data), len(body), err)
	}
}

func TestTriggerRefs(t *testing.T) {
	if got := callbacks.TriggerURL("https://chime.example/", callbacks.ModeEnqueueMessage, "tok"); got != "https://chime.example/api/callbacks/enqueue/tok" {
		t.Errorf("url %q", got)
	}
	if callbacks.CallbackMsgID("trg_1", "k", "cb_1") != callbacks.CallbackMsgID("trg_1", "k", "cb_2") || callbacks.CallbackMsgID("trg_1", "k", "x") == callbacks.CallbackMsgID("trg_2", "k", "x") {
		t.Error("idempotency keys must be scoped to the trigger, and only to it")
	}
	if m, err := callbacks.ParseMode("", callbacks.ModeWakeHint); err != nil || m != callbacks.ModeWakeHint {
		t.Errorf("default mode %v %v", m, err)
	}
	if _, err := callbacks.ParseMode("wake", callbacks.ModeWakeHint); err == nil || err.Error() != "invalid_request: delivery_mode must be wake_hint or enqueue_message, not wake" {
		t.Errorf("bad mode: %v", err)
	}
}

func FuzzDecodeCallbackBody(f *testing.F) {
	for _, s := range [][2]string{{"application/json", `{"text":"a"}`}, {"text/plain", "x"}, {"", "{"}, {"image/png", "\x00"},
		{"application/x+json", "[]"}, {";;", ""}, {"application/json", `{"text":"a","text":"b"}`}, {"", "{\"a\":\"\xff\"}"},
		{"application/json", `"\udc00"`}, {"text/plain", "\xff"}, {"", `{"TEXT":"x"} `}} {
		f.Add(s[0], []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		p, err := callbacks.DecodeCallbackBody(contentType, body)
		if err != nil {
			subjectstest.Rejected(t, body, err, subjects.CodeInvalidJSON, subjects.CodePayloadTooLarge)
			return
		}
		forms := 0
		for _, set := range []bool{p.Text != "", p.JSON != nil, p.BodyBase64 != ""} {
			if set {
				forms++
			}
		}
		if forms > 1 || (forms == 0 && len(bytes.TrimSpace(body)) != 0) {
			t.Fatalf("%q %q decoded as %+v", contentType, body, p)
		}
		switch {
		case p.JSON != nil:
			// Strict JSON, compact: it reads back as itself.
			again, err := callbacks.DecodeCallbackBody("application/json", p.JSON)
			if !utf8.Valid(p.JSON) || err != nil || !bytes.Equal(again.JSON, p.JSON) {
				t.Fatalf("%q: JSON %q reads back as %+v (%v)", body, p.JSON, again, err)
			}
		case p.Text != "":
			if !utf8.ValidString(p.Text) || p.Text != string(body) {
				t.Fatalf("%q: text %q", body, p.Text)
			}
		case p.BodyBase64 != "":
			if raw, err := base64.StdEncoding.DecodeString(p.BodyBase64); err != nil || !bytes.Equal(raw, body) || p.ContentType == "" {
				t.Fatalf("%q: bytes %+v", body, p)
			}
		}
		if r := []rune(p.WakeReason()); len(r) == 0 || (p.Text == "" && len(r) > 163) {
			t.Fatalf("reason of %d characters", len(r))
		}
		env := callbacks.CallbackEnvelope(&callbacks.CallbackEvent{ID: "x", AgentID: "a", TriggerID: "t", Mode: callbacks.ModeWakeHint, Payload: p})
		if _, err := env.Msg(); err != nil {
			t.Fatalf("envelope: %v", err)
		}
	})
}
