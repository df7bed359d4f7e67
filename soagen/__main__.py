from soagen.cli import main

raise SystemExit(main())
