// Package cli parses a stand-in's command line the way the programs it replaces do: their own
// flags (defined by the caller before Parse), plus --version and -v, which every sidecar takes,
// and no positional arguments.
package cli

import (
	"flag"
	"fmt"
	"log"
	"os"
)

// Parse parses the command line; with --version it prints version and exits.
func Parse(version string) {
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Int("v", 0, "log verbosity (accepted; this stand-in logs little)")
	flag.Parse()
	if *showVersion {
		fmt.Println(os.Args[0], version)
		os.Exit(0)
	}
	if flag.NArg() > 0 {
		log.Fatalf("unexpected arguments %q", flag.Args())
	}
}
