// Package xrcnodes holds tests of XRC across processes and emulated nodes:
// ranks in processes of their own on two software HCAs in device
// processes (softhca/hcatest), each node's ranks sharing one XRC domain,
// coordinated through bootstrap as the launcher's ranks are. It has no
// code besides its tests.
package xrcnodes
