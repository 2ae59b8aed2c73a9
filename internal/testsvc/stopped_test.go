package testsvc

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/testwait"
)

func TestAwaitStoppedSeesEveryThreadStopped(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if threadsStopped(cmd.Process.Pid) {
		t.Fatal("a running process reported stopped")
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := AwaitStopped(cmd.Process.Pid, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	testwait.For(t, "the process running again", func() bool { return !threadsStopped(cmd.Process.Pid) })
}
