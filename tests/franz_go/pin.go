// Package franzgo only pins github.com/twmb/franz-go for scripts/setup.sh, which
// compiles that module's pkg/kgo tests (go test -c); nothing here is run.
package franzgo

import _ "github.com/twmb/franz-go/pkg/kgo"
