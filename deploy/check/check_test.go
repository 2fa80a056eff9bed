package main

import (
	"errors"
	"strings"
	"testing"
)

// valid is a small rendered chart: a hardened Deployment, the Service,
// PodDisruptionBudget and NetworkPolicy that select it, and a
// ServiceMonitor on the Service.
const valid = `---
# Source: chime/templates/service.yaml
apiVersion: v1
kind: Service
metadata:
  name: chime
  labels: {app: chime}
spec:
  selector: {app: chime}
  ports: [{name: http, port: 8080, targetPort: http}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: chime}
spec:
  maxUnavailable: 1
  selector: {matchLabels: {app: chime}}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: chime}
spec:
  selector: {matchLabels: {app: chime}}
  endpoints: [{port: http, path: /metrics}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: chime}
spec:
  podSelector: {matchLabels: {app: chime}}
  policyTypes: [Ingress]
  ingress:
    - ports: [{port: http, protocol: TCP}]
      from:
        - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: ingress-nginx}}
          podSelector: {matchLabels: {app.kubernetes.io/name: ingress-nginx}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: chime}
spec:
  replicas: 3
  selector: {matchLabels: {app: chime}}
  template:
    metadata: {labels: {app: chime}}
    spec:
      securityContext:
        runAsNonRoot: true
        seccompProfile: {type: RuntimeDefault}
      containers:
        - name: chime
          image: chime:1
          ports: [{name: http, containerPort: 8080}]
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {drop: [ALL]}
          volumeMounts: [{name: tokens, mountPath: /etc/chime}]
      volumes:
        - name: tokens
          secret: {secretName: t, defaultMode: 0440}
`

func TestValid(t *testing.T) {
	objs, err := Check(strings.NewReader(valid))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 5 {
		t.Fatalf("%d objects, want 5", len(objs))
	}
}

// TestRejects changes one thing in the valid manifests at a time; each
// change must fail, with an error that says what is wrong.
func TestRejects(t *testing.T) {
	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"unknown field", "  replicas: 3", "  replicas: 3\n  replica: 3", `unknown field "spec.replica"`},
		{"misplaced field", "          image: chime:1", "          image: chime:1\n          imagePolicy: Always", `unknown field "spec.template.spec.containers[0].imagePolicy"`},
		{"duplicate field", "  replicas: 3", "  replicas: 3\n  replicas: 4", `key "replicas" already set`},
		{"wrong type", "  replicas: 3", "  replicas: three", "replicas"},
		{"unknown kind", "kind: PodDisruptionBudget", "kind: PodDisruptionBudgets", `no kind "PodDisruptionBudgets"`},
		{"old API version", "apiVersion: policy/v1\n", "apiVersion: policy/v1beta1\n", "policy/v1beta1"},
		{"unknown ServiceMonitor field", "  endpoints:", "  endpoint: []\n  endpoints:", `unknown field "spec.endpoint"`},
		{"Service selects nothing", "  selector: {app: chime}", "  selector: {app: chim}", "Service chime: its selector selects no pod template"},
		{"PDB selects nothing", "  maxUnavailable: 1\n  selector: {matchLabels: {app: chime}}", "  maxUnavailable: 1\n  selector: {matchLabels: {app: other}}", "PodDisruptionBudget chime: its selector"},
		{"ServiceMonitor selects nothing", "  selector: {matchLabels: {app: chime}}\n  endpoints", "  selector: {matchLabels: {app: none}}\n  endpoints", "ServiceMonitor chime: its selector"},
		{"Deployment selects not its pods", "  selector: {matchLabels: {app: chime}}\n  template", "  selector: {matchLabels: {app: chime, tier: api}}\n  template", "Deployment chime: its selector"},
		{"label not a string", "    metadata: {labels: {app: chime}}", "    metadata: {labels: {app: chime, on: yes}}", "cannot unmarshal bool"},
		{"root allowed", "        runAsNonRoot: true", "        runAsNonRoot: false", "runAsNonRoot: true"},
		{"writable root", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", "readOnlyRootFilesystem must be true"},
		{"privilege escalation", "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true", "allowPrivilegeEscalation must be false"},
		{"capabilities kept", "capabilities: {drop: [ALL]}", "capabilities: {drop: [NET_RAW]}", "capabilities must drop ALL"},
		{"capability added", "capabilities: {drop: [ALL]}", "capabilities: {drop: [ALL], add: [NET_ADMIN]}", "adds capabilities"},
		{"unknown NetworkPolicy field", "  policyTypes: [Ingress]", "  policyType: [Ingress]", `unknown field "spec.policyType"`},
		{"NetworkPolicy selects every pod", "  podSelector: {matchLabels: {app: chime}}\n  policyTypes", "  podSelector: {}\n  policyTypes", "NetworkPolicy chime: an empty podSelector selects every pod"},
		{"NetworkPolicy names a port the pods lack", "[{port: http, protocol: TCP}]", "[{port: https, protocol: TCP}]", `NetworkPolicy chime: ingress[0] names port "https"`},
		{"NetworkPolicy peer selector invalid", "podSelector: {matchLabels: {app.kubernetes.io/name: ingress-nginx}}", "podSelector: {matchExpressions: [{key: app, operator: Sometimes}]}", "ingress[0].from[0].podSelector"},
		{"no seccomp", "        seccompProfile: {type: RuntimeDefault}\n", "", "seccompProfile must be RuntimeDefault"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := strings.Replace(valid, tc.old, tc.new, 1)
			if in == valid {
				t.Fatalf("the change %q did not apply", tc.old)
			}
			_, err := Check(strings.NewReader(in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestEmptyRenderFails(t *testing.T) {
	for _, in := range []string{"", "---\n# Source: chime/templates/x.yaml\n---\n"} {
		if _, err := Check(strings.NewReader(in)); !errors.Is(err, ErrNoObjects) {
			t.Errorf("%q: got %v, want ErrNoObjects", in, err)
		}
	}
}

func TestNotYAML(t *testing.T) {
	if _, err := Check(strings.NewReader("kind: [\n")); err == nil {
		t.Fatal("broken YAML passed")
	}
}
