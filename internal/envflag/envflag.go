// Package envflag gives every kvindex binary the same configuration precedence:
// command-line flags > KVINDEX_* environment variables > defaults.
//
// A flag named "grpc-addr" is read from KVINDEX_GRPC_ADDR when it was not given on the
// command line. A one-letter flag is the short form of a long one (kvctl's -o
// for --output) and has no variable of its own: the long flag's variable must
// not beat the short flag given on the command line, nor a stray KVINDEX_O the
// long one. Binaries with sub-components may use a longer prefix (for example
// KVINDEX_FAKEENGINE_). The package holds no state; it is safe for concurrent use on
// distinct FlagSets.
package envflag

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// EnvName is the environment variable consulted for the flag name under prefix.
func EnvName(prefix, flagName string) string {
	return prefix + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(flagName))
}

// Parse parses args into fs, then fills every flag that was not set on the command
// line from its environment variable (see EnvName), looked up with lookup
// (os.LookupEnv when nil). A bad environment value is an error naming the variable.
func Parse(fs *flag.FlagSet, prefix string, args []string, lookup func(string) (string, bool)) error {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var firstErr error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || firstErr != nil || isShort(f.Name) {
			return
		}
		name := EnvName(prefix, f.Name)
		v, ok := lookup(name)
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			firstErr = fmt.Errorf("environment %s=%q: %w", name, v, err)
		}
	})
	return firstErr
}

// Usage returns a flag.Usage function that prints a synopsis followed by every flag
// with its default and the environment variable that can set it.
func Usage(fs *flag.FlagSet, prefix, synopsis string) func() {
	return func() {
		out := fs.Output()
		fmt.Fprintln(out, synopsis)
		fmt.Fprintln(out, "\nFlags (each may also be set by the environment variable shown; flags win):")
		fs.VisitAll(func(f *flag.Flag) {
			name, usage := flag.UnquoteUsage(f)
			fmt.Fprintf(out, "  --%s %s\n    \t%s", f.Name, name, strings.ReplaceAll(usage, "\n", "\n    \t"))
			if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && f.DefValue != "[]" {
				fmt.Fprintf(out, " (default %s)", f.DefValue)
			}
			if isShort(f.Name) {
				fmt.Fprintln(out)
				return
			}
			fmt.Fprintf(out, " [$%s]\n", EnvName(prefix, f.Name))
		})
	}
}

// isShort reports whether name is a one-letter short form (see the package doc).
func isShort(name string) bool { return len(name) == 1 }

// SplitList splits a comma-separated flag value into its items, trimmed, with
// empty ones dropped ("a, b,," is [a b]).
func SplitList(v string) []string {
	var out []string
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// List is a flag.Value holding a comma-separated list: Set replaces the list with
// the non-empty, space-trimmed items of its argument.
type List struct{ Items *[]string }

func (l List) String() string {
	if l.Items == nil {
		return ""
	}
	return strings.Join(*l.Items, ",")
}

// Set parses a comma-separated value.
func (l List) Set(v string) error {
	*l.Items = nil
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l.Items = append(*l.Items, s)
		}
	}
	return nil
}

// Uint32 is a flag.Value holding a uint32: a value beyond its range is an
// error, not wrapped (a plain flag.UintVar converted afterwards turns
// 4294967312 into 16).
type Uint32 struct{ V *uint32 }

func (f Uint32) String() string {
	if f.V == nil {
		return "0"
	}
	return strconv.FormatUint(uint64(*f.V), 10)
}

// Set parses a base-10 value in 0..4294967295.
func (f Uint32) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return err
	}
	*f.V = uint32(n)
	return nil
}
