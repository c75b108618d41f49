from populace.cli.main import app

app()
