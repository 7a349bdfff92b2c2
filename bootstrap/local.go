package bootstrap

import (
	"context"
	"fmt"
)

// A world of one has no server: the client answers its own calls.

func newLocal(me Member, cfg ClientConfig) *Client {
	c := newClient(me, 1, cfg)
	c.members = []Member{c.me}
	c.local = map[string][]byte{}
	c.lkick = make(chan struct{})
	return c
}

func (c *Client) localCheck(ctx context.Context) error {
	if err := c.Err(); err != nil {
		return err
	}
	return ctx.Err()
}

func (c *Client) localPut(ctx context.Context, key string, val []byte) error {
	if err := c.localCheck(ctx); err != nil {
		return fmt.Errorf("bootstrap: put %q: %w", cut(key, 64), err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.local[key]; ok {
		if string(old) != string(val) {
			return fmt.Errorf("bootstrap: put %q: %w", cut(key, 64), ErrKeyExists)
		}
		return nil
	}
	c.local[key] = append([]byte{}, val...)
	close(c.lkick)
	c.lkick = make(chan struct{})
	return nil
}

func (c *Client) localGet(ctx context.Context, key string) ([]byte, error) {
	for {
		c.mu.Lock()
		v, ok := c.local[key]
		kick, err := c.lkick, c.err
		c.mu.Unlock()
		if ok {
			return append([]byte{}, v...), nil
		}
		if err != nil {
			return nil, fmt.Errorf("bootstrap: get %q: %w", cut(key, 64), err)
		}
		select {
		case <-kick:
		case <-c.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("bootstrap: get %q: %w", cut(key, 64), context.Cause(ctx))
		}
	}
}
