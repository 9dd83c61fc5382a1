package tokenize

import (
	"fmt"
	"slices"
	"strconv"
)

// ContentFormat is how a chat template receives each message's content: vLLM's
// --chat-template-content-format.
type ContentFormat string

const (
	// ContentFormatAuto detects the format from the template as vLLM does (the default).
	ContentFormatAuto ContentFormat = "auto"
	// ContentFormatString passes content as a string: text parts joined with "\n",
	// empty ones skipped.
	ContentFormatString ContentFormat = "string"
	// ContentFormatOpenAI passes content as a list of {"type": "text", "text": ...}
	// parts (a string content is one part), except a tool message's, which is a
	// string: its parts joined with "\n".
	ContentFormatOpenAI ContentFormat = "openai"
)

// ContentFormats lists every --chat-template-content-format value.
var ContentFormats = []ContentFormat{ContentFormatAuto, ContentFormatString, ContentFormatOpenAI}

// resolve returns the format a template is rendered with: f itself unless it is auto
// (or unset), else the one the template's source shows.
func (f ContentFormat) resolve(tags []tag) (ContentFormat, error) {
	switch f {
	case ContentFormatString, ContentFormatOpenAI:
		return f, nil
	case ContentFormatAuto, "":
		return detectContentFormat(tags)
	}
	return "", fmt.Errorf("%w: chat template content format %q, want one of %v", ErrNotSupported, f, ContentFormats)
}

// detectContentFormat is vLLM's detection (vllm/renderers/hf.py, formerly
// vllm/entrypoints/chat_utils.py, _detect_content_format): a template is "openai" when
// it loops over a message's content ({% for part in message['content'] %}), read from
// Jinja2's syntax tree:
//
//   - the message lists are the variable messages and every variable a
//     {% set v = ... %} binds to a message list, found breadth first;
//   - the message variables are the targets of {% for m in ... %} loops over a
//     message list;
//   - a content loop is a {% for %} over m.content or m['content'] of a message
//     variable m,
//
// where "over x" means x itself, or x filtered (x | f), tested (x is t) or sliced
// (x[a:b]), any number of times. Scopes are ignored. Where vLLM's walk fails an
// assertion (a set or loop target that is not a plain name in one of the steps above,
// e.g. {% set ns.msgs = messages %}), it falls back to "string", and so does this.
// The one departure: vLLM never ends on assignments that bind message lists to each
// other in a cycle; here each variable is followed once.
func detectContentFormat(tags []tag) (ContentFormat, error) {
	var sets, loops []binding
	for _, t := range tags {
		if !t.block || len(t.toks) == 0 || t.toks[0].kind != tokName {
			continue
		}
		var b binding
		var err error
		switch t.toks[0].text {
		case "for":
			b, err = parseFor(t.toks[1:])
			loops = append(loops, b)
		case "set":
			var assign bool
			if b, assign, err = parseSet(t.toks[1:]); assign {
				sets = append(sets, b)
			}
		}
		if err != nil {
			return "", fmt.Errorf("%w: chat template: %v", ErrNotSupported, err)
		}
	}
	lists := []string{"messages"}
	for queued := 0; queued < len(lists); queued++ {
		for _, s := range sets {
			if !s.value.reads(lists[queued], "") {
				continue
			}
			if s.target == "" {
				return ContentFormatString, nil
			}
			if !slices.Contains(lists, s.target) {
				lists = append(lists, s.target)
			}
		}
	}
	var messageVars []string
	for _, l := range loops {
		if slices.ContainsFunc(lists, func(v string) bool { return l.value.reads(v, "") }) {
			if l.target == "" {
				return ContentFormatString, nil
			}
			messageVars = append(messageVars, l.target)
		}
	}
	for _, l := range loops {
		if slices.ContainsFunc(messageVars, func(v string) bool { return l.value.reads(v, "content") }) {
			if l.target == "" {
				return ContentFormatString, nil
			}
			return ContentFormatOpenAI, nil
		}
	}
	return ContentFormatString, nil
}

// binding is a {% set target = value %} or a {% for target in value %}; target is ""
// when it is not a plain name (a tuple, or a namespace attribute ns.x).
type binding struct {
	target string
	value  *exprNode
}

type exprKind uint8

const (
	exprOther  exprKind = iota
	exprName            // a variable
	exprAttr            // x.key or x['key']
	exprSlice           // x[a:b]
	exprFilter          // x | f
	exprTest            // x is t
)

// exprNode is the part of Jinja2's expression tree the detection reads; every other
// expression is exprOther.
type exprNode struct {
	kind exprKind
	// name is the variable of an exprName and the key of an exprAttr.
	name string
	// of is what an exprAttr, exprSlice, exprFilter or exprTest applies to.
	of *exprNode
}

var otherExpr = &exprNode{}

// reads reports whether n is the variable v (with key "") or v's member key, possibly
// filtered, tested or sliced: vLLM's _is_var_or_elems_access.
func (n *exprNode) reads(v, key string) bool {
	for n.kind == exprFilter || n.kind == exprTest || n.kind == exprSlice {
		n = n.of
	}
	if key == "" {
		return n.kind == exprName && n.name == v
	}
	return n.kind == exprAttr && n.name == key && n.of.kind == exprName && n.of.name == v
}

// parseFor reads "target in iter ..." of a {% for %} tag, as Jinja2's parse_for.
func parseFor(toks []token) (binding, error) {
	p := &exprParser{toks: toks}
	target, err := p.assignTarget("in", false)
	if err != nil {
		return binding{}, err
	}
	if !p.at(tokName, "in") {
		return binding{}, p.fail("expected 'in'")
	}
	p.i++
	iter, err := p.tuple(false, "recursive", false)
	if err != nil {
		return binding{}, err
	}
	return binding{target: target, value: iter}, nil
}

// parseSet reads "target = value" of a {% set %} tag, as Jinja2's parse_set; assign
// is false for a block set ({% set x %}...{% endset %}).
func parseSet(toks []token) (b binding, assign bool, err error) {
	p := &exprParser{toks: toks}
	if b.target, err = p.assignTarget("", true); err != nil {
		return b, false, err
	}
	if !p.at(tokOp, "=") {
		return b, false, nil
	}
	p.i++
	b.value, err = p.tuple(true, "", false)
	return b, true, err
}

// exprParser is a recursive-descent parser of Jinja2 expressions, one method per
// method of Jinja2's Parser (parse_tuple, parse_or, ...), building exprNodes.
type exprParser struct {
	toks []token
	i    int
}

func (p *exprParser) at(kind tokKind, text string) bool {
	return p.i < len(p.toks) && p.toks[p.i].is(kind, text)
}

func (p *exprParser) atOp(ops ...string) bool {
	return p.i < len(p.toks) && p.toks[p.i].kind == tokOp && slices.Contains(ops, p.toks[p.i].text)
}

func (p *exprParser) fail(msg string) error {
	if p.i < len(p.toks) {
		return fmt.Errorf("%s at byte %d (%q)", msg, p.toks[p.i].pos, p.toks[p.i].text)
	}
	return fmt.Errorf("%s at the end of a tag", msg)
}

func (p *exprParser) expectOp(op string) error {
	if !p.at(tokOp, op) {
		return p.fail("expected " + strconv.Quote(op))
	}
	p.i++
	return nil
}

// assignTarget is parse_assign_target: the name it binds, or "" for a tuple or a
// namespace attribute.
func (p *exprParser) assignTarget(endName string, withNamespace bool) (string, error) {
	if withNamespace && p.i+1 < len(p.toks) && p.toks[p.i].kind == tokName && p.toks[p.i+1].is(tokOp, ".") {
		p.i += 3
		return "", nil
	}
	n, err := p.tupleOf(p.primary, endName, false)
	if err != nil || n.kind != exprName {
		return "", err
	}
	return n.name, nil
}

// tupleEnd is is_tuple_end: the end of the tag, ")" or the extra end name.
func (p *exprParser) tupleEnd(endName string) bool {
	return p.i >= len(p.toks) || p.at(tokOp, ")") || (endName != "" && p.at(tokName, endName))
}

// tuple is parse_tuple of full expressions (withCondexpr: with "a if b else c").
func (p *exprParser) tuple(withCondexpr bool, endName string, parens bool) (*exprNode, error) {
	parse := p.or
	if withCondexpr {
		parse = p.condexpr
	}
	return p.tupleOf(parse, endName, parens)
}

func (p *exprParser) tupleOf(parse func() (*exprNode, error), endName string, parens bool) (*exprNode, error) {
	var items int
	var first *exprNode
	for {
		if items > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		if p.tupleEnd(endName) {
			break
		}
		n, err := parse()
		if err != nil {
			return nil, err
		}
		if items == 0 {
			first = n
		}
		items++
		if !p.at(tokOp, ",") {
			break
		}
	}
	switch {
	case items == 1 && !p.lastWasComma():
		return first, nil
	case items == 0 && !parens:
		return nil, p.fail("expected an expression")
	}
	return otherExpr, nil
}

// lastWasComma tells "(a,)" (a tuple) from "(a)".
func (p *exprParser) lastWasComma() bool { return p.i > 0 && p.toks[p.i-1].is(tokOp, ",") }

func (p *exprParser) condexpr() (*exprNode, error) {
	n, err := p.or()
	for err == nil && p.at(tokName, "if") {
		p.i++
		if _, err = p.or(); err != nil {
			break
		}
		if p.at(tokName, "else") {
			p.i++
			_, err = p.condexpr()
		}
		n = otherExpr
	}
	return n, err
}

// binary parses operands joined by any of the operators (names such as "or", or
// operator tokens); two or more operands make an exprOther.
func (p *exprParser) binary(operand func() (*exprNode, error), names []string, ops ...string) (*exprNode, error) {
	n, err := operand()
	for err == nil && (p.atOp(ops...) || p.i < len(p.toks) && p.toks[p.i].kind == tokName && slices.Contains(names, p.toks[p.i].text)) {
		p.i++
		_, err = operand()
		n = otherExpr
	}
	return n, err
}

func (p *exprParser) or() (*exprNode, error)  { return p.binary(p.and, []string{"or"}) }
func (p *exprParser) and() (*exprNode, error) { return p.binary(p.not, []string{"and"}) }

func (p *exprParser) not() (*exprNode, error) {
	if p.at(tokName, "not") {
		p.i++
		_, err := p.not()
		return otherExpr, err
	}
	return p.compare()
}

func (p *exprParser) compare() (*exprNode, error) {
	n, err := p.math1()
	for err == nil {
		switch {
		case p.atOp("==", "!=", ">", ">=", "<", "<="), p.at(tokName, "in"):
			p.i++
		case p.at(tokName, "not") && p.i+1 < len(p.toks) && p.toks[p.i+1].is(tokName, "in"):
			p.i += 2
		default:
			return n, nil
		}
		_, err = p.math1()
		n = otherExpr
	}
	return n, err
}

func (p *exprParser) math1() (*exprNode, error)  { return p.binary(p.concat, nil, "+", "-") }
func (p *exprParser) concat() (*exprNode, error) { return p.binary(p.math2, nil, "~") }
func (p *exprParser) math2() (*exprNode, error)  { return p.binary(p.pow, nil, "*", "/", "//", "%") }
func (p *exprParser) pow() (*exprNode, error)    { return p.binary(p.filtered, nil, "**") }

func (p *exprParser) filtered() (*exprNode, error) { return p.unary(true) }

// unary is parse_unary: a sign makes the operand an exprOther; then subscripts and
// calls, then (withFilter) filters, tests and calls.
func (p *exprParser) unary(withFilter bool) (*exprNode, error) {
	var n *exprNode
	var err error
	if p.atOp("-", "+") {
		p.i++
		_, err = p.unary(false)
		n = otherExpr
	} else {
		n, err = p.primary()
	}
	if err == nil {
		n, err = p.postfix(n)
	}
	if err == nil && withFilter {
		n, err = p.filterExpr(n)
	}
	return n, err
}

func (p *exprParser) primary() (*exprNode, error) {
	if p.i >= len(p.toks) {
		return nil, p.fail("expected an expression")
	}
	tok := p.toks[p.i]
	p.i++
	switch {
	case tok.kind == tokName:
		switch tok.text {
		case "true", "false", "True", "False", "none", "None":
			return otherExpr, nil
		}
		return &exprNode{kind: exprName, name: tok.text}, nil
	case tok.kind == tokString:
		for p.i < len(p.toks) && p.toks[p.i].kind == tokString {
			p.i++
		}
		return otherExpr, nil
	case tok.kind == tokNumber:
		return otherExpr, nil
	case tok.is(tokOp, "("):
		n, err := p.tuple(true, "", true)
		if err == nil {
			err = p.expectOp(")")
		}
		return n, err
	case tok.is(tokOp, "["):
		return otherExpr, p.items("]", false)
	case tok.is(tokOp, "{"):
		return otherExpr, p.items("}", true)
	}
	p.i--
	return nil, p.fail("unexpected token")
}

// items reads the rest of a list or dict literal (pairs: key: value items).
func (p *exprParser) items(closer string, pairs bool) error {
	for first := true; !p.at(tokOp, closer); first = false {
		if !first {
			if err := p.expectOp(","); err != nil {
				return err
			}
			if p.at(tokOp, closer) {
				break
			}
		}
		if _, err := p.condexpr(); err != nil {
			return err
		}
		if pairs {
			if err := p.expectOp(":"); err != nil {
				return err
			}
			if _, err := p.condexpr(); err != nil {
				return err
			}
		}
	}
	return p.expectOp(closer)
}

// postfix is parse_postfix: .name, .0, [subscript] and (call) after a primary.
func (p *exprParser) postfix(n *exprNode) (*exprNode, error) {
	for {
		var err error
		switch {
		case p.at(tokOp, "."):
			p.i++
			if p.i >= len(p.toks) || (p.toks[p.i].kind != tokName && p.toks[p.i].kind != tokNumber) {
				return nil, p.fail("expected name or number")
			}
			if p.toks[p.i].kind == tokName {
				n = &exprNode{kind: exprAttr, name: p.toks[p.i].text, of: n}
			} else {
				n = otherExpr
			}
			p.i++
		case p.at(tokOp, "["):
			p.i++
			n, err = p.subscript(n)
		case p.at(tokOp, "("):
			n, err = otherExpr, p.callArgs()
		default:
			return n, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// subscript reads the rest of x[...] (parse_subscript): x['key'] is an exprAttr, a
// single slice an exprSlice, anything else an exprOther.
func (p *exprParser) subscript(of *exprNode) (*exprNode, error) {
	var args []*exprNode
	var key string
	var keyed bool
	for !p.at(tokOp, "]") {
		if len(args) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		start := p.i
		arg, err := p.subscribed()
		if err != nil {
			return nil, err
		}
		// A key is one string constant ('con' 'tent' included, as Jinja2 joins them).
		keyed = arg == otherExpr && p.i > start
		for j := start; j < p.i && keyed; j++ {
			keyed = p.toks[j].kind == tokString
		}
		if keyed {
			key = ""
			for _, t := range p.toks[start:p.i] {
				s, err := pyStringLiteral(t.text)
				if err != nil {
					return nil, err
				}
				key += s
			}
		}
		args = append(args, arg)
	}
	p.i++
	switch {
	case len(args) != 1:
		return otherExpr, nil
	case keyed:
		return &exprNode{kind: exprAttr, name: key, of: of}, nil
	case args[0].kind == exprSlice:
		return &exprNode{kind: exprSlice, of: of}, nil
	}
	return otherExpr, nil
}

// subscribed is parse_subscribed: an expression, or a slice a:b:c (any part omitted),
// returned as an exprSlice.
func (p *exprParser) subscribed() (*exprNode, error) {
	slice := &exprNode{kind: exprSlice}
	if p.at(tokOp, ":") {
		p.i++
	} else {
		n, err := p.condexpr()
		if err != nil || !p.at(tokOp, ":") {
			return n, err
		}
		p.i++
	}
	if !p.atOp(":", "]", ",") {
		if _, err := p.condexpr(); err != nil {
			return nil, err
		}
	}
	if p.at(tokOp, ":") {
		p.i++
		if !p.atOp("]", ",") {
			if _, err := p.condexpr(); err != nil {
				return nil, err
			}
		}
	}
	return slice, nil
}

// callArgs reads (args) as parse_call_args: positional and keyword arguments, *args,
// **kwargs, a trailing comma.
func (p *exprParser) callArgs() error {
	if err := p.expectOp("("); err != nil {
		return err
	}
	for first := true; !p.at(tokOp, ")"); first = false {
		if !first {
			if err := p.expectOp(","); err != nil {
				return err
			}
			if p.at(tokOp, ")") {
				break
			}
		}
		switch {
		case p.atOp("*", "**"):
			p.i++
		case p.i+1 < len(p.toks) && p.toks[p.i].kind == tokName && p.toks[p.i+1].is(tokOp, "="):
			p.i += 2
		}
		if _, err := p.condexpr(); err != nil {
			return err
		}
	}
	p.i++
	return nil
}

// filterExpr is parse_filter_expr: filters (| name.name(args)), tests
// (is [not] name(args) or is name arg) and calls after a unary expression.
func (p *exprParser) filterExpr(n *exprNode) (*exprNode, error) {
	for {
		var err error
		switch {
		case p.at(tokOp, "|"):
			p.i++
			if err = p.dottedName(); err == nil && p.at(tokOp, "(") {
				err = p.callArgs()
			}
			n = &exprNode{kind: exprFilter, of: n}
		case p.at(tokName, "is"):
			p.i++
			negated := p.at(tokName, "not")
			if negated {
				p.i++
			}
			if err = p.dottedName(); err != nil {
				break
			}
			if p.at(tokOp, "(") {
				err = p.callArgs()
			} else if p.testArgFollows() {
				var arg *exprNode
				if arg, err = p.primary(); err == nil {
					_, err = p.postfix(arg)
				}
			}
			n = &exprNode{kind: exprTest, of: n}
			if negated {
				n = otherExpr
			}
		case p.at(tokOp, "("):
			n, err = otherExpr, p.callArgs()
		default:
			return n, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// testArgFollows: a test takes one argument without parentheses (x is divisibleby 3)
// when a name other than else/or/and, a literal or a bracket follows.
func (p *exprParser) testArgFollows() bool {
	if p.i >= len(p.toks) {
		return false
	}
	t := p.toks[p.i]
	switch t.kind {
	case tokName:
		return t.text != "else" && t.text != "or" && t.text != "and"
	case tokString, tokNumber:
		return true
	}
	return t.text == "(" || t.text == "[" || t.text == "{"
}

// dottedName reads a filter or test name, which may be dotted (a.b).
func (p *exprParser) dottedName() error {
	for {
		if p.i >= len(p.toks) || p.toks[p.i].kind != tokName {
			return p.fail("expected a name")
		}
		p.i++
		if !p.at(tokOp, ".") {
			return nil
		}
		p.i++
	}
}
