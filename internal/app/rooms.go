package app

import (
	"context"

	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/query"
	"github.com/presenced/presenced/internal/wire"
)

// openRooms builds the fan-out of rooms (who on this node watches which
// room). It takes the tracker's joins and leaves and its users' changes;
// its snapshots are read through the edges' reader, built later.
func (a *App) openRooms(context.Context) error {
	var err error
	a.rooms, err = fanout.NewRoomHub(fanout.RoomConfig{
		Reader:     roomSnapshots{a},
		Contacts:   a.durable,
		MaxWatched: a.cfg.MaxWatchedRooms,
		Clock:      a.cfg.Clock,
		Logger:     a.cfg.Logger.With("component", "rooms"),
	})
	if err != nil {
		return err
	}
	a.stats.Rooms = a.rooms.Stats
	a.add(part{run: quiet(a.rooms.Run), stop: stopLast, publish: a.rooms})
	return nil
}

// roomSnapshots reads a watcher's first view of a room: every member up
// to a batch read's worth (query.MaxBatch), each as the watcher may see
// them.
type roomSnapshots struct{ a *App }

func (s roomSnapshots) RoomSnapshot(ctx context.Context, viewer, room string) (fanout.RoomSnapshot, error) {
	v, err := s.a.reader.Room(ctx, viewer, room, "", query.MaxBatch)
	if err != nil {
		return fanout.RoomSnapshot{}, err
	}
	ids := make([]string, len(v.Members))
	for i := range v.Members {
		ids[i] = v.Members[i].UserID
	}
	return fanout.RoomSnapshot{
		Frame:    wire.AppendRoom(nil, room, false, v.Count, v.Members, v.Next, v.Version),
		Version:  v.Version,
		Count:    v.Count,
		Members:  ids,
		Complete: v.Next == "",
	}, nil
}
