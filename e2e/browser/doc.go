// Package browser holds chime's browser tests: the console served by the
// built `chime serve`, driven in headless Chromium (chromedp). It is a
// module of its own, so that chromedp stays out of the main module's graph;
// run its tests with (cd e2e/browser && go test -race ./...).
package browser
