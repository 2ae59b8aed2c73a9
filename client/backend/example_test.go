package backend_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/presenced/presenced/client/backend"
)

// ExampleClient_Batch shows an app backend reading what user 42 may see
// of two other users, and handling a refusal.
func ExampleClient_Batch() {
	b, err := backend.New(backend.Config{URL: "http://127.0.0.1:8080", APIKey: "the node's -api-key"})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	views, err := b.Batch(ctx, []string{"7", "9"}, "42")
	var e *backend.Error
	switch {
	case errors.As(err, &e) && e.Temporary():
		fmt.Printf("refused for now (%s): retry in %s\n", e.Code, e.RetryAfter)
		return
	case err != nil:
		fmt.Println(err)
		return
	}
	for id, v := range views {
		if v.Status == nil {
			fmt.Println(id, "hides their status from 42")
			continue
		}
		fmt.Println(id, "is", *v.Status)
	}
}

// ExampleClient_SetContacts shows the account calls: who sees a user's
// presence.
func ExampleClient_SetContacts() {
	b, err := backend.New(backend.Config{URL: "http://127.0.0.1:8080", APIKey: "the node's -api-key"})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	// 42 shows their status to contacts only, their last seen to nobody.
	if _, err := b.SetSettings(ctx, "42", backend.Settings{Status: backend.Contacts, LastSeen: backend.Nobody}); err != nil {
		fmt.Println(err)
		return
	}
	list, err := b.SetContacts(ctx, "42", []string{"7", "9"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("42's contacts:", list)
}
