//go:build !linux

package natsproc

import "syscall"

// sysProcAttr: elsewhere only tb.Cleanup stops the server.
func sysProcAttr() *syscall.SysProcAttr { return nil }
