package app

import (
	"context"

	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/query"
)

// openRooms builds the fan-out of rooms (who on this node watches which
// room). It takes the tracker's joins and leaves and its users' changes,
// and with NATS the other nodes' (openBus: the bus subscribes to the
// watched rooms and their members); its snapshots are read through the
// edges' reader, built later.
func (a *App) openRooms(context.Context) error {
	var err error
	a.rooms, err = fanout.NewRoomHub(fanout.RoomConfig{
		Reader:        roomSnapshots{a},
		Contacts:      a.durable,
		MaxWatched:    a.cfg.MaxWatchedRooms,
		IntervalAbove: a.cfg.RoomIntervalAbove,
		Interval:      a.cfg.RoomInterval,
		Clock:         a.cfg.Clock,
		Logger:        a.cfg.Logger.With("component", "rooms"),
	})
	if err != nil {
		return err
	}
	a.stats.Rooms = a.rooms.Stats
	a.add(part{run: quiet(a.rooms.Run), stop: stopLast, publish: a.rooms})
	return nil
}

// roomSnapshots reads a watcher's first view of a room: its first
// members, each as the watcher may see them; and members' true states,
// which the room hub filters per class of watcher.
type roomSnapshots struct{ a *App }

func (s roomSnapshots) RoomSnapshot(ctx context.Context, viewer, room string, limit int) (fanout.RoomSnapshot, error) {
	v, err := s.a.reader.Room(ctx, viewer, room, "", min(limit, query.MaxBatch))
	return fanout.RoomSnapshot{Version: v.Version, Count: v.Count, Members: v.Members, Next: v.Next}, err
}

func (s roomSnapshots) MemberStates(ctx context.Context, ids []string, out []presence.Snapshot) error {
	return s.a.reader.States(ctx, ids, out)
}
