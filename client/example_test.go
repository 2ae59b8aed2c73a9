package client_test

import (
	"context"
	"fmt"
	"time"

	"github.com/presenced/presenced/client"
)

// fetchToken stands for a request to the app's backend, which mints client
// tokens: HS256, sub = the user id, exp within the server's
// -max-token-lifetime.
func fetchToken(context.Context) (string, error) { return "eyJ…", nil }

// ExampleDial shows a device that watches two users and reports what it
// sees until the context ends.
func ExampleDial() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, client.Config{
		URL: "http://127.0.0.1:8080",
		// Asked before every connection: the server closes a socket when
		// its token expires, and the client comes back with a fresh one
		// as the same device, unseen by anyone watching.
		TokenFunc: fetchToken,
	})
	if err != nil {
		fmt.Println("connect:", err)
		return
	}
	defer c.Close()
	fmt.Println("connected as device", c.Welcome().DeviceID)

	if err := c.Subscribe(ctx, "2", "3"); err != nil {
		fmt.Println("subscribe:", err)
		return
	}
	c.SetActive(false) // the person went idle: heartbeats say so
	for {
		select {
		case <-ctx.Done():
			c.Bye(context.Background()) // logout: offline for everyone at once
			return
		case u, ok := <-c.Updates():
			if !ok {
				return
			}
			switch u := u.(type) {
			case client.Event:
				fmt.Printf("%s is %s (last seen %s)\n", u.UserID, u.Status, u.LastSeen.Format(time.Kitchen))
			case client.StateChange:
				fmt.Println("connection:", u.State, u.Err)
			case *client.ServerError:
				fmt.Println("refused:", u.Code, u.Message)
			}
		}
	}
}

// ExampleClient_WatchRoom shows a device in a call's room that keeps a
// "who's here" list: the first RoomSnapshot, then each RoomChange. After
// a reconnect the client joins and watches the room again by itself; a
// member who left meanwhile comes as a leave (Snapshot set), and nothing
// comes when nothing changed. A big room (interval mode) sends a
// RoomInterval per interval instead: the list then holds only some of its
// members, and Count is the one number for all of them.
func ExampleClient_WatchRoom() {
	ctx := context.Background()
	// The token's "rooms" claim must allow the room (e.g. ["call-*"]).
	c, err := client.Dial(ctx, client.Config{URL: "http://127.0.0.1:8080", TokenFunc: fetchToken})
	if err != nil {
		fmt.Println("connect:", err)
		return
	}
	defer c.Close()
	if err := c.Join(ctx, "call-7"); err != nil {
		fmt.Println("join:", err)
		return
	}
	if err := c.WatchRoom(ctx, "call-7"); err != nil {
		fmt.Println("watch:", err)
		return
	}
	here := map[string]client.Status{}
	for u := range c.Updates() {
		switch u := u.(type) {
		case client.RoomSnapshot: // replace what is held
			here = u.Members
		case client.RoomChange:
			if u.Kind == client.RoomLeave {
				delete(here, u.UserID)
			} else {
				here[u.UserID] = u.Status
			}
			fmt.Printf("%s: %s %s, %d here\n", u.Room, u.UserID, u.Kind, u.Count)
		case client.RoomInterval: // a big room: ids only, no status
			for _, id := range u.Left {
				delete(here, id)
			}
			for _, id := range u.Joined {
				here[id] = client.Hidden
			}
			fmt.Printf("%s: %d joined, %d left, %d here\n", u.Room,
				len(u.Joined)+u.MoreJoined, len(u.Left)+u.MoreLeft, u.Count)
		case *client.ServerError: // e.g. room_not_allowed
			fmt.Println("refused:", u.Code, u.Message)
		}
	}
}
