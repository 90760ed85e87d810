"""Where the build puts the shim, libnvproxy.so."""
