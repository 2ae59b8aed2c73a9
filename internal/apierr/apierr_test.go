package apierr_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/presenced/presenced/internal/apierr"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/writegate"
)

// unavailable is an error the tracker classifies as transient.
type unavailable struct{}

func (unavailable) Error() string     { return "the store is down" }
func (unavailable) Unavailable() bool { return true }

func TestClassify(t *testing.T) {
	p := auth.Principal{Kind: auth.Client, UserID: "alice"}
	_, other := p.ActFor("bob")
	_, noUser := auth.Principal{Kind: auth.Backend}.ActFor("")
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{apierr.New(418, "teapot", "short and stout"), 418, "teapot"},
		{fmt.Errorf("wrapped: %w", apierr.New(429, "rate_limited", "slow down")), 429, "rate_limited"},
		{other, 403, "forbidden"},
		{noUser, 400, "invalid_id"},
		{auth.ErrMissing, 401, "unauthorized"},
		{fmt.Errorf("%w: expired", auth.ErrInvalid), 401, "unauthorized"},
		{fmt.Errorf("beat: %w", presence.ErrTooManyDevices), 409, "too_many_devices"},
		{presence.ErrTooManyContacts, 400, "too_many_contacts"},
		{fmt.Errorf("join %q: %w", "r", presence.ErrTooManyRooms), 409, "too_many_rooms"},
		{fmt.Errorf("join %q: %w", "r", presence.ErrDeviceNotAlive), 409, "device_not_alive"},
		{tracker.ErrRoomsUnsupported, 501, "rooms_unavailable"},
		{apierr.RoomNotAllowed("r"), 403, "room_not_allowed"},
		{context.Canceled, 499, "canceled"},
		{fmt.Errorf("contacts: %w", writegate.ErrBusy), 503, "busy"},
		{fmt.Errorf("save: %w", unavailable{}), 503, "unavailable"},
		{errors.New("disk on fire"), 500, "internal"},
	} {
		e := apierr.Classify(tc.err)
		if e.Status != tc.status || e.Code != tc.code || e.Message == "" {
			t.Errorf("Classify(%v) = %d %s %q, want %d %s", tc.err, e.Status, e.Code, e.Message, tc.status, tc.code)
		}
	}
	if e := apierr.Classify(errors.New("secret detail")); e.Message == "secret detail" {
		t.Error("an internal error's detail reached the client")
	}
}

func TestWrite(t *testing.T) {
	w := httptest.NewRecorder()
	apierr.Write(w, fmt.Errorf("x: %w", unavailable{}))
	if w.Code != 503 || w.Header().Get("Retry-After") != "1" || w.Header().Get("Content-Type") != "application/json" ||
		w.Body.String() != `{"error":{"code":"unavailable","message":"a backend of the service is unavailable; nothing was changed, retry later"}}`+"\n" {
		t.Errorf("503: %d %v %s", w.Code, w.Header(), w.Body)
	}
	w = httptest.NewRecorder()
	w.Header().Set("Retry-After", "7")
	apierr.Write(w, apierr.Busy)
	if got := w.Header().Get("Retry-After"); got != "7" {
		t.Errorf("the caller's Retry-After was replaced by %q", got)
	}
}
