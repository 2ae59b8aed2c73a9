package app

import (
	"context"
	"hash/maphash"
	"log/slog"
	"sync"
	"time"

	"github.com/presenced/presenced/internal/fanout"
)

// contactLister reads a contact list as it is durable.
type contactLister interface {
	Contacts(ctx context.Context, owner string) ([]string, error)
}

// contactRelay tells the hub that an owner's contact list changed — on
// this node (the HTTP API) or on another one (the bus) — with the list as
// it is now durable, so watchers who stopped being contacts stop seeing a
// contacts-only status. Changes of one owner are serialised, so the hub's
// last word is the newest list. Changed is safe for concurrent use.
//
// Watchers whose view of the owner changed with the list are sent their
// new view, read through state (the hub's ContactsChanged); the node that
// made the change stamped the owner a new version before announcing it
// (Tracker.ContactsChanged), so that view is above everything they had.
type contactRelay struct {
	lists contactLister
	hub   *fanout.Hub
	state fanout.StateFunc
	log   *slog.Logger
	seed  maphash.Seed
	locks [64]sync.Mutex // by owner: one change of an owner at a time
}

func newContactRelay(lists contactLister, hub *fanout.Hub, state fanout.StateFunc, log *slog.Logger) *contactRelay {
	return &contactRelay{lists: lists, hub: hub, state: state, log: log, seed: maphash.MakeSeed()}
}

// Changed reads owner's list and hands it to the hub.
func (c *contactRelay) Changed(owner string) {
	mu := &c.locks[maphash.String(c.seed, owner)%uint64(len(c.locks))]
	mu.Lock()
	defer mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := c.lists.Contacts(ctx, owner)
	if err != nil {
		// Fail closed: until the list can be read again (the next change,
		// a resubscribe or a resync), the owner's watchers are treated as
		// non-contacts, so nobody just removed keeps seeing a contacts-only
		// status.
		c.log.Error("reading a changed contact list for the fan-out; treating every watcher as a non-contact", "user_id", owner, "err", err)
		list = nil
	}
	c.hub.ContactsChanged(ctx, owner, list, c.state)
}
