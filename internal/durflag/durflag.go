// Package durflag is the one reading of a duration that agent-wrap's
// command lines and the MCP server's tool arguments share: a Go duration
// ("90s", "5m") or a bare number of seconds ("30", "0.5"), never negative.
package durflag

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Parse reads s as a Go duration or a number of seconds. Negative values
// are refused; the error says what was expected, without repeating s.
func Parse(s string) (time.Duration, error) {
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		if v < 0 {
			return 0, errors.New("must not be negative")
		}
		return time.Duration(v * float64(time.Second)), nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("not a duration (like 30s, 5m or a number of seconds)")
	}
	if v < 0 {
		return 0, errors.New("must not be negative")
	}
	return v, nil
}

// Value is a pflag value read by Parse.
type Value time.Duration

func (d *Value) String() string { return time.Duration(*d).String() }
func (d *Value) Type() string   { return "duration" }
func (d *Value) Set(s string) error {
	v, err := Parse(s)
	if err != nil {
		return err
	}
	*d = Value(v)
	return nil
}
