from nvproxy.cli import main

raise SystemExit(main())
