// A TCP relay as Go programs commonly write one: io.Copy between two *net.TCPConn,
// which Go (since 1.11: TCPConn.ReadFrom) carries out with splice(2).
// scripts/sockmap-measure.py --check builds it and sends bytes through it with and
// without the sockmap redirection.
//
//	goproxy LISTEN_ADDR UPSTREAM_ADDR
package main

import (
	"io"
	"net"
	"os"
)

func main() {
	ln, err := net.Listen("tcp", os.Args[1])
	if err != nil {
		panic(err)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			panic(err)
		}
		go relay(c.(*net.TCPConn))
	}
}

func relay(c *net.TCPConn) {
	defer c.Close()
	u, err := net.Dial("tcp", os.Args[2])
	if err != nil {
		return
	}
	up := u.(*net.TCPConn)
	defer up.Close()
	go func() {
		io.Copy(up, c)
		up.CloseWrite()
	}()
	io.Copy(c, up)
	c.CloseWrite()
}
