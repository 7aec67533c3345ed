package cli

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// durationValue is a pflag value that takes a Go duration ("90s", "5m") or
// a bare number of seconds ("30", "0.5").
type durationValue time.Duration

func (d *durationValue) String() string { return time.Duration(*d).String() }
func (d *durationValue) Type() string   { return "duration" }
func (d *durationValue) Set(s string) error {
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		if v < 0 {
			return errors.New("must not be negative")
		}
		*d = durationValue(time.Duration(v * float64(time.Second)))
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("not a duration (like 30s, 5m or a number of seconds)")
	}
	if v < 0 {
		return errors.New("must not be negative")
	}
	*d = durationValue(v)
	return nil
}
