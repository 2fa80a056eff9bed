package natsproc

import "syscall"

// sysProcAttr has the kernel SIGKILL the server if the test binary dies
// without running its cleanups (a -timeout panic, a kill of go test), so no
// orphan keeps its ports and store. The signal strictly follows the forking
// OS thread, which Go retires only when a goroutine exits while locked to it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
