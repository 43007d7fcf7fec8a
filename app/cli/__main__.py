from app.cli.program import main

main()
