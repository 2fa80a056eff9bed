//go:build !linux

package bench

import "syscall"

// sysProcAttr: elsewhere only the bench's cleanup stops its replicas.
func sysProcAttr() *syscall.SysProcAttr { return nil }
