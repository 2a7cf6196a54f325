package loadgen

import (
	"io"
	"os"
)

// IsTerminal reports whether w is a terminal (a character device), where a
// progress line may be redrawn in place with \r; elsewhere (a file, a pipe,
// CI) a progress printer writes only its final line.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
