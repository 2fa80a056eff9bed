package e2e_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/questions"
	"github.com/chime-nats/chime/subjects"
)

// TestCLIQuestions: an agent asks over NATS; the operator lists and
// answers with the built binary; the agent's inbox holds one answer, and a
// second answer is refused.
func TestCLIQuestions(t *testing.T) {
	natsAddr := freeAddr(t)
	startServe(t, "questions", "CHIME_DATA_DIR="+t.TempDir(), "CHIME_NATS_LISTEN="+natsAddr)
	nc, err := nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	agent, _ := client.New(nc, "cliq")
	ask, err := agent.Ask(context.Background(), questions.QuestionItem{Title: "Merge the PR?", Options: []string{"merge", "wait"}},
		questions.QuestionItem{Title: "Note for the changelog?"})
	if err != nil {
		t.Fatal(err)
	}

	out, errOut, code := chimeCLI(t, natsAddr, "question", "list", "--json", "--agent", "cliq")
	var list []questions.Question
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].ID != ask.QuestionID {
		t.Fatalf("question list: exit %d, %q %s", code, out, errOut)
	}

	_, errOut, code = chimeCLI(t, natsAddr, "question", "answer", ask.QuestionID, "merge", "--agent", "cliq")
	if code != 1 || !strings.Contains(errOut, "invalid_request: question "+ask.QuestionID+" has 2 titles: give 2 answers, in order, not 1") {
		t.Errorf("one answer for two titles: exit %d, %s", code, errOut)
	}
	out, errOut, code = chimeCLI(t, natsAddr, "question", "answer", ask.QuestionID, "--agent", "cliq", "merge", "fixes the flaky test")
	var rep questions.AnswerReply
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || !rep.OK || rep.Question.Status != questions.QuestionAnswered {
		t.Fatalf("question answer: exit %d, %q %s", code, out, errOut)
	}
	_, errOut, code = chimeCLI(t, natsAddr, "question", "answer", ask.QuestionID, "wait", "x", "--agent", "cliq")
	if code != 1 || !strings.Contains(errOut, "conflict: question "+ask.QuestionID+" is already answered") {
		t.Errorf("second answer: exit %d, %s", code, errOut)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"question", "answer", ask.QuestionID}, "a question ID and an answer"},
		{[]string{"question"}, "list or answer"},
		{[]string{"question", "frob"}, `unknown question command "frob"`},
	} {
		if _, errOut, code := chimeCLI(t, natsAddr, tc.args...); code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("chime %v: exit %d, %q, want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}

	var answers []subjects.Envelope
	for _, d := range inbox(t, nc) {
		if d.env.Kind == subjects.KindAnswer {
			answers = append(answers, d.env)
		}
	}
	if len(answers) != 1 || answers[0].Source.ID != ask.QuestionID || answers[0].Trust != subjects.TrustOperator ||
		!strings.Contains(answers[0].Text, "Answer: fixes the flaky test") {
		t.Fatalf("answer envelopes: %+v", answers)
	}
	out, _, _ = chimeCLI(t, natsAddr, "question", "list", "--json", "--agent", "cliq")
	if strings.TrimSpace(out) != "[]" {
		t.Errorf("open questions after the answer: %s", out)
	}
	out, _, _ = chimeCLI(t, natsAddr, "question", "list", "--json", "--all", "--agent", "cliq")
	if json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].Answers[1] != "fixes the flaky test" {
		t.Errorf("question list --all: %s", out)
	}
}
