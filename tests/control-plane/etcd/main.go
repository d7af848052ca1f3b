// The etcd server binary, as etcd's own main.go builds it (that module
// replaces its siblings with local paths, so it cannot be required).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
