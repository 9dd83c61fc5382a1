package deploytest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// The Dockerfiles are read by this small line reader rather than BuildKit's
// parser (github.com/moby/buildkit is not among the modules vetted for this
// repository and would pull in a large dependency tree for a test). It knows
// what deploy/docker uses: comments, parser directives, backslash line
// continuations and the JSON (exec) form of ENTRYPOINT and CMD.

// instruction is one Dockerfile instruction with its continuation lines joined.
type instruction struct {
	line int    // first line, 1-based
	cmd  string // upper case: FROM, RUN, COPY, ...
	args string
}

// stage is one FROM ... [AS name] and the instructions under it.
type stage struct {
	base, name string
	body       []instruction
}

func (s stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.body {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// last returns the stage's last instruction cmd (the one that takes effect for
// USER, ENTRYPOINT and CMD), or ok false.
func (s stage) last(cmd string) (instruction, bool) {
	ins := s.all(cmd)
	if len(ins) == 0 {
		return instruction{}, false
	}
	return ins[len(ins)-1], true
}

// readDockerfile splits path into stages. Docker drops comment lines even
// inside a continuation, and so does this reader.
func readDockerfile(path string) ([]stage, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		stages  []stage
		pending strings.Builder
		start   int
	)
	flush := func() error {
		text := strings.TrimSpace(pending.String())
		pending.Reset()
		if text == "" {
			return nil
		}
		cmd, args, _ := strings.Cut(text, " ")
		in := instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := stage{base: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			} else if len(f) != 1 {
				return fmt.Errorf("%s:%d: FROM %q: want `FROM image [AS name]`", path, start, in.args)
			}
			stages = append(stages, st)
			return nil
		}
		if len(stages) == 0 {
			return fmt.Errorf("%s:%d: %s before the first FROM", path, start, in.cmd)
		}
		stages[len(stages)-1].body = append(stages[len(stages)-1].body, in)
		return nil
	}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || line == "" && pending.Len() == 0 {
			continue
		}
		if pending.Len() == 0 {
			start = n
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			pending.WriteString(cont + " ")
			continue
		}
		pending.WriteString(line)
		if err := flush(); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if pending.Len() > 0 {
		return nil, fmt.Errorf("%s: ends inside a line continuation", path)
	}
	return stages, nil
}

// execForm decodes the JSON array form of ENTRYPOINT or CMD. The shell form
// is refused: it runs /bin/sh -c as PID 1, which does not forward SIGTERM to
// the binary, and distroless images have no shell at all.
func execForm(in instruction) ([]string, error) {
	var argv []string
	if err := json.Unmarshal([]byte(in.args), &argv); err != nil || len(argv) == 0 {
		return nil, fmt.Errorf("line %d: %s %s: want the exec form [\"/path\", ...]", in.line, in.cmd, in.args)
	}
	return argv, nil
}
