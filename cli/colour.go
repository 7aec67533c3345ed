package cli

import "os"

// colour reports whether output to w may be coloured: w is a terminal,
// NO_COLOR is unset or empty (no-color.org) and TERM is not "dumb".
func (e *Env) colour(w any) bool {
	f, ok := w.(*os.File)
	if !ok || e.Getenv("NO_COLOR") != "" || e.Getenv("TERM") == "dumb" {
		return false
	}
	return isTerminal(f.Fd())
}
