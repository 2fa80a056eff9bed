package bench

import "syscall"

// sysProcAttr has the kernel SIGKILL a chaos replica if the bench dies
// without stopping it, so no orphan keeps firing timers and holding ports.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
