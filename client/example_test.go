package client_test

import (
	"context"
	"fmt"
	"time"

	"github.com/presenced/presenced/client"
)

// ExampleDial shows a device that watches two users and reports what it
// sees until the context ends.
func ExampleDial() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, client.Config{
		URL:   "http://127.0.0.1:8080",
		Token: "eyJ…", // minted by your backend: HS256, sub = the user id, exp set
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
