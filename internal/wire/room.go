package wire

import (
	"strconv"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
)

// The JSON of rooms. A room's watchers see who is in it with each
// member's status as the privacy filter lets them (null when hidden) and
// each join and leave by its kind; the API key's exits (the change
// stream, webhooks) get each event with its reason. A room's version is a
// number, as a user's is in a change: 0 for a room that had no event yet.

// AppendRoom appends the WebSocket message of a page of a room's
// members, the answer to a watch of it:
//
//	{"type":"room","mode":"events","room":"doc-42","count":3,
//	 "members":{"alice":"online","bob":"busy","carol":null},
//	 "next":null,"version":7}
//
// mode is "interval" when interval (the room is big: its watchers get
// AppendRoomInterval once per interval instead of every change), else
// "events"; the rest is AppendRoomPage's.
func AppendRoom(b []byte, room string, interval bool, count int, members []privacy.View, next string, version uint64) []byte {
	if interval {
		b = append(b, `{"type":"room","mode":"interval",`...)
	} else {
		b = append(b, `{"type":"room","mode":"events",`...)
	}
	return append(appendRoomPage(b, room, count, members, next, version), '}')
}

// AppendRoomPage appends a page of a room's members as the HTTP API
// answers a read of it:
//
//	{"room":"doc-42","count":3,"members":{"alice":"online","carol":null},
//	 "next":"carol","version":7}
//
// count is all the room's members, members this page of them, each once,
// keyed by user id in the order given; a member's status is null when it
// is hidden from the viewer. next is the cursor of the following page
// (the last member id of this one) when more follow; empty, it reads
// null.
func AppendRoomPage(b []byte, room string, count int, members []privacy.View, next string, version uint64) []byte {
	return append(appendRoomPage(append(b, '{'), room, count, members, next, version), '}')
}

// appendRoomPage appends the fields of a page, without braces.
func appendRoomPage(b []byte, room string, count int, members []privacy.View, next string, version uint64) []byte {
	b = append(b, `"room":`...)
	b = AppendString(b, room)
	b = append(b, `,"count":`...)
	b = strconv.AppendInt(b, int64(count), 10)
	b = append(b, `,"members":{`...)
	for i := range members {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendString(b, members[i].UserID)
		b = append(b, ':')
		b = AppendStatus(b, &members[i])
	}
	b = append(b, `},"next":`...)
	if next == "" {
		b = append(b, "null"...)
	} else {
		b = AppendString(b, next)
	}
	b = append(b, `,"version":`...)
	return strconv.AppendUint(b, version, 10)
}

// AppendRoomChange appends the WebSocket message of one join or leave of
// a room for one view of the member:
//
//	{"type":"room_change","room":"doc-42","user_id":"dave","event":"join",
//	 "status":"online","count":4,"version":8}
//
// status is the member's as status shows it to the viewer, or null when
// it is hidden (or status is nil), and always null for a leave. Watchers
// are told the kind only, never the reason.
func AppendRoomChange(b []byte, ev *presence.RoomEvent, status *privacy.View) []byte {
	b = append(b, `{"type":"room_change","room":`...)
	b = AppendString(b, ev.Room)
	b = append(b, `,"user_id":`...)
	b = AppendString(b, ev.UserID)
	b = append(b, `,"event":"`...)
	b = append(b, ev.Kind.String()...)
	b = append(b, `","status":`...)
	if ev.Kind == presence.RoomLeave || status == nil {
		b = append(b, "null"...)
	} else {
		b = AppendStatus(b, status)
	}
	return appendRoomTail(b, ev.Count, ev.Version)
}

// AppendRoomStatus appends the WebSocket message of a member's change of
// status, as v shows it to the viewer (null when hidden):
//
//	{"type":"room_change","room":"r","user_id":"bob","event":"status",
//	 "status":"away","count":4,"version":8}
//
// count and version are the room's, which the change of status leaves
// as they were.
func AppendRoomStatus(b []byte, room string, v *privacy.View, count int, version uint64) []byte {
	b = append(b, `{"type":"room_change","room":`...)
	b = AppendString(b, room)
	b = append(b, `,"user_id":`...)
	b = AppendString(b, v.UserID)
	b = append(b, `,"event":"status","status":`...)
	b = AppendStatus(b, v)
	return appendRoomTail(b, count, version)
}

// appendRoomTail appends ,"count":…,"version":…} of a room_change.
func appendRoomTail(b []byte, count int, version uint64) []byte {
	b = append(b, `,"count":`...)
	b = strconv.AppendInt(b, int64(count), 10)
	b = append(b, `,"version":`...)
	b = strconv.AppendUint(b, version, 10)
	return append(b, '}')
}

// AppendRoomEvent appends the JSON of a room event as it leaves the node
// for the API key's exits (the change stream, webhooks), with its reason:
//
//	{"room":"doc-42","user_id":"dave","event":"join","reason":"joined",
//	 "count":4,"version":8,"at":"2026-01-02T03:04:05.678Z"}
//
// It is the true event, never for a client.
func AppendRoomEvent(b []byte, ev *presence.RoomEvent) []byte {
	b = append(b, `{"room":`...)
	b = AppendString(b, ev.Room)
	b = append(b, `,"user_id":`...)
	b = AppendString(b, ev.UserID)
	b = append(b, `,"event":"`...)
	b = append(b, ev.Kind.String()...)
	b = append(b, `","reason":"`...)
	b = append(b, ev.Reason.String()...)
	b = append(b, `","count":`...)
	b = strconv.AppendInt(b, int64(ev.Count), 10)
	b = append(b, `,"version":`...)
	b = strconv.AppendUint(b, ev.Version, 10)
	b = append(b, `,"at":`...)
	b = AppendTime(b, ev.At)
	return append(b, '}')
}

// AppendRoomCounts appends the member counts of rooms, keyed by room id
// in the order given: {"a":3,"b":0}. counts[i] is the count of rooms[i];
// the caller passes each room once and the two slices of one length.
func AppendRoomCounts(b []byte, rooms []string, counts []int) []byte {
	b = append(b, '{')
	for i, room := range rooms {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendString(b, room)
		b = append(b, ':')
		b = strconv.AppendInt(b, int64(counts[i]), 10)
	}
	return append(b, '}')
}

// AppendRoomInterval appends the message a watcher of a big room gets
// once per interval instead of every change:
//
//	{"type":"room_interval","room":"big","count":100412,"joined":["u1"],
//	 "left":[],"more_joined":0,"more_left":0,"version":9}
//
// joined and left are user ids that joined and left since the last one
// (as many as the message carries), moreJoined and moreLeft how many
// more did beyond those listed.
func AppendRoomInterval(b []byte, room string, count int, joined, left []string, moreJoined, moreLeft int, version uint64) []byte {
	b = append(b, `{"type":"room_interval","room":`...)
	b = AppendString(b, room)
	b = append(b, `,"count":`...)
	b = strconv.AppendInt(b, int64(count), 10)
	b = appendStrings(b, `,"joined":`, joined)
	b = appendStrings(b, `,"left":`, left)
	b = append(b, `,"more_joined":`...)
	b = strconv.AppendInt(b, int64(moreJoined), 10)
	b = append(b, `,"more_left":`...)
	b = strconv.AppendInt(b, int64(moreLeft), 10)
	b = append(b, `,"version":`...)
	b = strconv.AppendUint(b, version, 10)
	return append(b, '}')
}

// appendStrings appends key and ss as a JSON array of strings ([] when
// empty or nil).
func appendStrings(b []byte, key string, ss []string) []byte {
	b = append(b, key...)
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendString(b, s)
	}
	return append(b, ']')
}
