// promqlcheck parses every PromQL expression of Grafana dashboards and Prometheus rule files
// with Prometheus' own parser (the module pinned in ../go.mod), and checks that each metric they
// select is one we export or one named as allowed (-metrics, a file of names, one a line).
//
//	promqlcheck -metrics names.txt dashboard.json... rules.yaml...
//
// In a dashboard it reads every panel's targets[].expr (rows' nested panels too) and every
// template variable's query (label_values(EXPR, LABEL) and query_result(EXPR) give their EXPR).
// Grafana's variables are replaced before parsing: $__rate_interval, $__interval and $__range by
// a duration, any other $name or ${name} by a word (they stand inside label matchers' quotes).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

type expression struct {
	where string // file and place in it, for messages
	text  string
}

var (
	durationVar = regexp.MustCompile(`\$\{?__(rate_interval|interval|range)(:[^}]*)?\}?`)
	otherVar    = regexp.MustCompile(`\$\{[A-Za-z0-9_]+(:[^}]*)?\}|\$[A-Za-z_][A-Za-z0-9_]*`)
	labelValues = regexp.MustCompile(`(?s)^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)
	labelOnly   = regexp.MustCompile(`^\s*label_values\(\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)
	queryResult = regexp.MustCompile(`(?s)^\s*query_result\((.*)\)\s*$`)
	histogramOf = regexp.MustCompile(`_(bucket|count|sum)$`)
)

// substitute replaces Grafana's variables by text the PromQL parser accepts.
func substitute(expr string) string {
	expr = durationVar.ReplaceAllString(expr, "5m")
	return otherVar.ReplaceAllString(expr, "grafana_variable")
}

// panelExpressions collects the targets' expressions of panels, and of panels within rows.
func panelExpressions(file string, panels []any, out *[]expression) {
	for _, p := range panels {
		panel, ok := p.(map[string]any)
		if !ok {
			continue
		}
		title, _ := panel["title"].(string)
		if targets, ok := panel["targets"].([]any); ok {
			for i, t := range targets {
				target, ok := t.(map[string]any)
				if !ok {
					continue
				}
				if expr, ok := target["expr"].(string); ok {
					*out = append(*out, expression{fmt.Sprintf("%s: panel %q target %d", file, title, i), expr})
				}
			}
		}
		if nested, ok := panel["panels"].([]any); ok {
			panelExpressions(file, nested, out)
		}
	}
}

func dashboardExpressions(file string) ([]expression, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var dashboard map[string]any
	if err := json.Unmarshal(data, &dashboard); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	var out []expression
	panels, _ := dashboard["panels"].([]any)
	panelExpressions(file, panels, &out)
	if templating, ok := dashboard["templating"].(map[string]any); ok {
		list, _ := templating["list"].([]any)
		for _, v := range list {
			variable, ok := v.(map[string]any)
			if !ok || variable["type"] != "query" {
				continue
			}
			name, _ := variable["name"].(string)
			query := variable["query"]
			if q, ok := query.(map[string]any); ok {
				query = q["query"]
			}
			text, _ := query.(string)
			where := fmt.Sprintf("%s: variable %q", file, name)
			switch {
			case labelOnly.MatchString(text):
				// label_values(LABEL): no expression.
			case labelValues.MatchString(text):
				out = append(out, expression{where, labelValues.FindStringSubmatch(text)[1]})
			case queryResult.MatchString(text):
				out = append(out, expression{where, queryResult.FindStringSubmatch(text)[1]})
			default:
				return nil, fmt.Errorf("%s: a query variable's query is neither label_values nor query_result: %q", where, text)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no expression found", file)
	}
	return out, nil
}

func ruleExpressions(file string) ([]expression, error) {
	groups, errs := rulefmt.ParseFile(file, false, model.UTF8Validation,
		parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: %v", file, errs)
	}
	var out []expression
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			name := r.Alert
			if name == "" {
				name = r.Record
			}
			out = append(out, expression{fmt.Sprintf("%s: group %q rule %q", file, g.Name, name), r.Expr})
		}
	}
	return out, nil
}

func readNames(file string) (map[string]bool, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names := map[string]bool{}
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if line != "" && !strings.HasPrefix(line, "#") {
			names[line] = true
		}
	}
	return names, scanner.Err()
}

func main() {
	metricsFile := flag.String("metrics", "", "file of the metric names expressions may select, one a line")
	flag.Parse()
	if *metricsFile == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: promqlcheck -metrics NAMES FILE.json|FILE.yaml...")
		os.Exit(2)
	}
	known, err := readNames(*metricsFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	p := parser.NewParser(parser.Options{})
	var all []expression
	for _, file := range flag.Args() {
		var exprs []expression
		if strings.HasSuffix(file, ".json") {
			exprs, err = dashboardExpressions(file)
		} else {
			exprs, err = ruleExpressions(file)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		all = append(all, exprs...)
	}
	failed := 0
	used := map[string]bool{}
	for _, e := range all {
		ast, err := p.ParseExpr(substitute(e.text))
		if err != nil {
			fmt.Printf("FAIL %s: %v\n    %s\n", e.where, err, e.text)
			failed++
			continue
		}
		var unknown []string
		parser.Inspect(ast, func(node parser.Node, _ []parser.Node) error {
			if vs, ok := node.(*parser.VectorSelector); ok {
				name := vs.Name
				if name == "" {
					unknown = append(unknown, "(a selector without a metric name)")
					return nil
				}
				used[name] = true
				if !known[name] && !known[histogramOf.ReplaceAllString(name, "")] {
					unknown = append(unknown, name)
				}
			}
			return nil
		})
		if len(unknown) > 0 {
			fmt.Printf("FAIL %s: selects metrics we do not export: %s\n", e.where, strings.Join(unknown, ", "))
			failed++
		}
	}
	names := make([]string, 0, len(used))
	for name := range used {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Printf("metrics selected: %s\n", strings.Join(names, " "))
	fmt.Printf("promql: %d passed, %d failed\n", len(all)-failed, failed)
	if failed > 0 {
		os.Exit(1)
	}
}
