package wsframe_test

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/wsframe"
)

func compile(t *testing.T, f ws.Frame) []byte {
	t.Helper()
	b, err := ws.CompileFrame(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Frames read back as they were written, one after another, control
// frames and an empty payload included.
func TestReadFrames(t *testing.T) {
	frames := []ws.Frame{
		ws.NewTextFrame([]byte(`{"type":"welcome"}`)),
		ws.NewPingFrame(nil),
		ws.NewBinaryFrame(bytes.Repeat([]byte{7}, 70_000)), // a 64-bit length
		ws.NewCloseFrame(ws.NewCloseFrameBody(ws.StatusGoingAway, "bye")),
	}
	var stream []byte
	for _, f := range frames {
		stream = append(stream, compile(t, f)...)
	}
	r := bytes.NewReader(stream)
	for i, want := range frames {
		got, err := wsframe.Read(r)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if got.Header != want.Header || !bytes.Equal(got.Payload, want.Payload) {
			t.Fatalf("frame %d: got %+v (%d bytes), want %+v (%d bytes)", i, got.Header, len(got.Payload), want.Header, len(want.Payload))
		}
	}
	if _, err := wsframe.Read(r); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

// A frame that declares more than MaxPayload is refused from its header
// alone; a payload cut short is an error.
func TestReadRefuses(t *testing.T) {
	big := ws.Header{Fin: true, OpCode: ws.OpText, Length: wsframe.MaxPayload + 1}
	var b bytes.Buffer
	if err := ws.WriteHeader(&b, big); err != nil {
		t.Fatal(err)
	}
	head := b.Len()
	b.WriteString("only a little of it")
	if _, err := wsframe.Read(&b); !errors.Is(err, wsframe.ErrTooLarge) {
		t.Errorf("a frame over the limit: %v, want ErrTooLarge", err)
	}
	if read := head + len("only a little of it") - b.Len(); read != head {
		t.Errorf("%d bytes read of a frame over the limit, want its %d-byte header alone", read, head)
	}

	cut := compile(t, ws.NewTextFrame([]byte("hello")))
	if _, err := wsframe.Read(bytes.NewReader(cut[:len(cut)-2])); err != io.ErrUnexpectedEOF {
		t.Errorf("a payload cut short: %v, want io.ErrUnexpectedEOF", err)
	}
}
