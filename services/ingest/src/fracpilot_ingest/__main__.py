from fracpilot_ingest.app import main

main()
