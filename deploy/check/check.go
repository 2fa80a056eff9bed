// Command check validates Kubernetes manifests (helm template output, the
// files in deploy/) against the Kubernetes API types: every object is
// decoded strictly into its k8s.io/api (or Prometheus Operator) type, so an
// unknown or duplicated field, a wrong type or an unknown kind fails. It
// also holds chime's pods to the chart's promises: selectors that select,
// and a hardened security context.
//
// It is a module of its own so that k8s.io/api stays out of chime's build
// and race-compiled test graph.
//
//	helm template chime helm/chime | check -
//	check deploy/chime.yaml
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: check FILE... (- reads standard input)")
		os.Exit(2)
	}
	failed := false
	for _, name := range os.Args[1:] {
		objs, err := checkFile(name)
		if err != nil {
			fmt.Fprintf(os.Stderr, "check: %s: %v\n", name, err)
			failed = true
			continue
		}
		fmt.Printf("check: %s: %d objects valid\n", name, len(objs))
	}
	if failed {
		os.Exit(1)
	}
}

func checkFile(name string) ([]runtime.Object, error) {
	var r io.Reader = os.Stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	return Check(r)
}

// ErrNoObjects is an input with no object in it: a render that produced
// nothing is a failure, not a pass.
var ErrNoObjects = errors.New("no Kubernetes object")

// decoder decodes strictly (unknown and duplicate fields are errors) into
// the types registered in its scheme; an unregistered kind is an error.
var decoder = func() runtime.Decoder {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme,
		networkingv1.AddToScheme, monitoringv1.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err) // a static list of known types
		}
	}
	return serializer.NewCodecFactory(s, serializer.EnableStrict).UniversalDeserializer()
}()

// Check decodes every document of a multi-document YAML stream and checks
// the objects together.
func Check(r io.Reader) ([]runtime.Object, error) {
	docs := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var objs []runtime.Object
	var errs []error
	for i := 1; ; i++ {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if empty(doc) {
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("document %d (%s): %w", i, describe(doc), err))
			continue
		}
		objs = append(objs, obj)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(objs) == 0 {
		return nil, ErrNoObjects
	}
	return objs, checkObjects(objs)
}

// empty reports a document of comments, separators and blank lines only
// (helm renders one for a template that yields nothing).
func empty(doc []byte) bool {
	for line := range bytes.SplitSeq(doc, []byte("\n")) {
		if l := bytes.TrimSpace(line); len(l) > 0 && l[0] != '#' && !bytes.Equal(l, []byte("---")) {
			return false
		}
	}
	return true
}

// describe names a document that did not decode by its kind and name lines.
func describe(doc []byte) string {
	var kind, name string
	for line := range strings.SplitSeq(string(doc), "\n") {
		if v, ok := strings.CutPrefix(line, "kind:"); ok && kind == "" {
			kind = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "  name:"); ok && name == "" {
			name = strings.TrimSpace(v)
		}
	}
	return kind + " " + name
}

// checkObjects holds the objects to what the chart promises: each
// Deployment's selector selects its pods and its containers are hardened;
// each Service, PodDisruptionBudget and ServiceMonitor selects something
// rendered beside it.
func checkObjects(objs []runtime.Object) error {
	var errs []error
	var pods []labels.Set
	var templates []corev1.PodTemplateSpec
	var services []labels.Set
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.Deployment:
			pods = append(pods, o.Spec.Template.Labels)
			templates = append(templates, o.Spec.Template)
			errs = append(errs, checkDeployment(o)...)
		case *corev1.Service:
			services = append(services, o.Labels)
		}
	}
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Service:
			if where := "Service " + o.Name; !selectsAny(labels.SelectorFromSet(o.Spec.Selector), pods) {
				errs = append(errs, fmt.Errorf("%s: its selector selects no pod template", where))
			}
		case *policyv1.PodDisruptionBudget:
			if err := selects("PodDisruptionBudget "+o.Name, o.Spec.Selector, pods); err != nil {
				errs = append(errs, err)
			}
		case *monitoringv1.ServiceMonitor:
			if err := selects("ServiceMonitor "+o.Name, &o.Spec.Selector, services); err != nil {
				errs = append(errs, err)
			}
		case *networkingv1.NetworkPolicy:
			errs = append(errs, checkNetworkPolicy(o, templates)...)
		}
	}
	return errors.Join(errs...)
}

func checkDeployment(d *appsv1.Deployment) []error {
	var errs []error
	where := "Deployment " + d.Name
	if d.Spec.Selector == nil {
		return []error{fmt.Errorf("%s: no selector", where)}
	}
	if err := selects(where, d.Spec.Selector, []labels.Set{d.Spec.Template.Labels}); err != nil {
		errs = append(errs, err)
	}
	pod := d.Spec.Template.Spec
	if len(pod.Containers) == 0 {
		errs = append(errs, fmt.Errorf("%s: no container", where))
	}
	if psc := pod.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		errs = append(errs, fmt.Errorf("%s: the pod must set runAsNonRoot: true", where))
	}
	for _, c := range append(pod.InitContainers, pod.Containers...) {
		errs = append(errs, hardened(where+" container "+c.Name, c.SecurityContext, pod.SecurityContext)...)
	}
	return errs
}

// checkNetworkPolicy holds a NetworkPolicy to what the chart means: it
// selects some pods, not every pod of the namespace (an empty selector);
// its peers' selectors parse; and a port named in a rule is a port of the
// rendered pods it selects (pods of another chart, such as NATS, are not
// rendered here and are not checked).
func checkNetworkPolicy(np *networkingv1.NetworkPolicy, templates []corev1.PodTemplateSpec) []error {
	where := "NetworkPolicy " + np.Name
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		return []error{fmt.Errorf("%s: podSelector: %w", where, err)}
	}
	if sel.Empty() {
		return []error{fmt.Errorf("%s: an empty podSelector selects every pod of the namespace", where)}
	}
	var errs []error
	for i, rule := range np.Spec.Ingress {
		for j, peer := range rule.From {
			for name, ls := range map[string]*metav1.LabelSelector{"podSelector": peer.PodSelector, "namespaceSelector": peer.NamespaceSelector} {
				if ls == nil {
					continue
				}
				if _, err := metav1.LabelSelectorAsSelector(ls); err != nil {
					errs = append(errs, fmt.Errorf("%s: ingress[%d].from[%d].%s: %w", where, i, j, name, err))
				}
			}
		}
		for _, p := range rule.Ports {
			if p.Port == nil || p.Port.Type != intstr.String {
				continue
			}
			for _, t := range templates {
				if sel.Matches(labels.Set(t.Labels)) && !namedPort(t.Spec, p.Port.StrVal) {
					errs = append(errs, fmt.Errorf("%s: ingress[%d] names port %q, which the pods it selects do not have", where, i, p.Port.StrVal))
				}
			}
		}
	}
	return errs
}

func namedPort(pod corev1.PodSpec, name string) bool {
	for _, c := range pod.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return true
			}
		}
	}
	return false
}

// hardened checks a container's security context: no privilege escalation,
// a read-only root filesystem, every capability dropped, and the
// RuntimeDefault seccomp profile (on the container or its pod).
func hardened(where string, sc *corev1.SecurityContext, psc *corev1.PodSecurityContext) []error {
	if sc == nil {
		return []error{fmt.Errorf("%s: no securityContext", where)}
	}
	var errs []error
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		errs = append(errs, fmt.Errorf("%s: allowPrivilegeEscalation must be false", where))
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		errs = append(errs, fmt.Errorf("%s: readOnlyRootFilesystem must be true", where))
	}
	if sc.Privileged != nil && *sc.Privileged {
		errs = append(errs, fmt.Errorf("%s: must not be privileged", where))
	}
	dropsAll := false
	if sc.Capabilities != nil {
		for _, c := range sc.Capabilities.Drop {
			dropsAll = dropsAll || c == "ALL"
		}
		if len(sc.Capabilities.Add) > 0 {
			errs = append(errs, fmt.Errorf("%s: adds capabilities %v", where, sc.Capabilities.Add))
		}
	}
	if !dropsAll {
		errs = append(errs, fmt.Errorf("%s: capabilities must drop ALL", where))
	}
	profile := sc.SeccompProfile
	if profile == nil && psc != nil {
		profile = psc.SeccompProfile
	}
	if profile == nil || profile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		errs = append(errs, fmt.Errorf("%s: seccompProfile must be RuntimeDefault", where))
	}
	return errs
}

// selects reports a label selector that is invalid or matches none of sets.
func selects(where string, ls *metav1.LabelSelector, sets []labels.Set) error {
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return fmt.Errorf("%s: selector: %w", where, err)
	}
	if !selectsAny(sel, sets) {
		return fmt.Errorf("%s: its selector (%s) selects nothing rendered", where, sel)
	}
	return nil
}

// selectsAny reports whether a non-empty selector matches one of sets (an
// empty one would match everything, which no chart object intends).
func selectsAny(sel labels.Selector, sets []labels.Set) bool {
	if sel.Empty() {
		return false
	}
	for _, s := range sets {
		if sel.Matches(s) {
			return true
		}
	}
	return false
}
